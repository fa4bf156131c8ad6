// The usage page on a large ledger (bench/README.md, "usage page"): a SQLite
// ledger of 10,000 keys × 365 days (each key on one route a day, a third of
// the keys with a quota or budget), and the time to build the page: whole,
// filtered by key and by route. The page's queries are bounded by date, so
// the time should follow the last 30 days' rows, not the year's.
// Run: npm run bench:usage-page [-- --keys 10000 --days 365]
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { KeyRecord } from '../src/keys/keyset.ts';
import { renderPage } from '../src/usage/page.ts';
import { usagePage } from '../src/usage/report.ts';
import { SqliteUsageStore } from '../src/usage/sqlite-store.ts';
import { DatabaseSync } from 'node:sqlite';
import { machine } from './proc.ts';

const { values: args } = parseArgs({ options: { keys: { type: 'string', default: '10000' }, days: { type: 'string', default: '365' } } });
const KEYS = Number(args.keys);
const DAYS = Number(args.days);
const ROUTES = ['scraper', 'seo', 'speech'];
const log = (line: string): void => void process.stderr.write(`${line}\n`);

const dir = mkdtempSync(join(tmpdir(), 'keyward-bench-page-'));
const path = join(dir, 'keys.json.usage.sqlite');
try {
  // The schema as the store makes it, then rows in bulk through one connection.
  await new SqliteUsageStore(path).close();
  const db = new DatabaseSync(path);
  const insert = db.prepare('insert into usage (key_id, route, day, requests, s2xx, cost) values (?, ?, ?, ?, ?, ?)');
  const today = Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate());
  let at = performance.now();
  db.exec('begin');
  for (let d = 0; d < DAYS; d++) {
    const day = new Date(today - d * 86_400_000).toISOString().slice(0, 10);
    for (let k = 0; k < KEYS; k++) {
      const route = ROUTES[(k + d) % 3] as string;
      const requests = 1 + ((k * 7 + d) % 50);
      insert.run(`key_${k.toString(16).padStart(12, '0')}`, route, day, requests, requests, route === 'scraper' ? 0 : requests * (route === 'seo' ? 0.002 : 40));
    }
  }
  db.exec('commit');
  db.close();
  log(`seeded ${(KEYS * DAYS).toLocaleString('en')} rows in ${((performance.now() - at) / 1000).toFixed(1)} s (${(statSync(path).size / 1024 ** 2).toFixed(0)} MB)`);

  const records: KeyRecord[] = Array.from({ length: KEYS }, (_, k) => ({
    id: `key_${k.toString(16).padStart(12, '0')}`,
    name: `client-${k}`,
    digest: `sha256:${'0'.repeat(64)}`,
    created: '2026-01-01T00:00:00Z',
    expires: null,
    revoked: null,
    ...(k % 3 === 0 ? { limits: k % 2 === 0 ? { quota: '40/day' } : { budgets: { speech: '1000/day' } } } : {}),
  }));
  const store = new SqliteUsageStore(path);
  const page = usagePage(store, () => records, ROUTES, (r) => (r === 'seo' ? 'usd' : r === 'speech' ? 'characters' : null), renderPage);
  // The longest the event loop (where requests run) went without a turn while the page was built.
  const time = async (what: string, params: Record<string, string>): Promise<void> => {
    const runs: number[] = [];
    const stalls: number[] = [];
    let bytes = 0;
    for (let i = 0; i < 5; i++) {
      let last = performance.now();
      let stall = 0;
      const tick = setInterval(() => {
        const t = performance.now();
        stall = Math.max(stall, t - last);
        last = t;
      }, 1);
      at = performance.now();
      bytes = (await page(new URLSearchParams(params))).length;
      runs.push(performance.now() - at);
      clearInterval(tick);
      stalls.push(Math.max(stall, performance.now() - last));
    }
    runs.sort((a, b) => a - b);
    stalls.sort((a, b) => a - b);
    log(`${what}: median ${runs[2]?.toFixed(0)} ms (${runs[0]?.toFixed(0)}–${runs[4]?.toFixed(0)}), ${(bytes / 1024).toFixed(0)} KiB; longest event-loop stall median ${stalls[2]?.toFixed(0)} ms (${stalls[0]?.toFixed(0)}–${stalls[4]?.toFixed(0)})`);
  };
  log(`# usage page, ${KEYS.toLocaleString('en')} keys × ${DAYS} days; ${machine()}`);
  await time('every key', {});
  await time('one key', { key: 'client-42' });
  await time('one route', { route: 'seo' });
  await store.close();
} finally {
  rmSync(dir, { recursive: true, force: true });
}
