// The usage page on a large ledger (bench/README.md, "usage page"): a SQLite
// ledger of 10,000 keys × 365 days (each key on one route a day, a third of
// the keys with a quota or budget), and the time to build the page: whole,
// filtered by key and by route. The page's queries are bounded by date, so
// the time should follow the last 30 days' rows, not the year's. Then the
// page's cost to everyone else: a gateway on that ledger and keys file, its
// proxied requests' p99 alone and while three different views of the page
// are rendered in a loop (the page is built in a thread of its own).
// Run: npm run bench:usage-page [-- --keys 20000 --days 3 --limited 1]
import { existsSync, mkdtempSync, renameSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import type { KeyRecord } from '../src/keys/keyset.ts';
import { renderPage } from '../src/views/page.ts';
import { usagePage } from '../src/views/report.ts';
import { SqliteUsageStore } from '../src/ledger/sqlite-store.ts';
import { DatabaseSync } from 'node:sqlite';
import { machine } from './proc.ts';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import http from 'node:http';
import { serialiseKeysFile } from '../src/keys/file-store.ts';
import { generateToken, tokenDigest } from '../src/keys/token.ts';
import { benchSecrets, keyward, startUpstreamProcess } from './systems.ts';

/** One GET, its latency in ms (status checked). */
function timed(url: string, headers: Record<string, string>): Promise<{ ms: number; status: number }> {
  const t = performance.now();
  return new Promise((resolve, reject) => {
    http
      .get(url, { headers }, (res) => {
        res.resume();
        res.on('end', () => resolve({ ms: performance.now() - t, status: res.statusCode ?? 0 }));
      })
      .on('error', reject);
  });
}

const p = (sorted: number[], q: number): number => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN;

/**
 * A gateway on the seeded ledger and keys: proxied requests one after
 * another for a few seconds, alone, then while three different views of
 * the page are fetched in a loop from the admin listener.
 */
async function alongside(records: KeyRecord[]): Promise<void> {
  const secrets = benchSecrets(randomBytes(4).toString('hex'), generateToken());
  const keysPath = join(dir, 'keys.json');
  const now = new Date().toISOString();
  writeFileSync(
    keysPath,
    serialiseKeysFile([
      { id: 'key_bench', name: 'bench', digest: `sha256:${tokenDigest(secrets.clientToken)}`, created: now, expires: null, revoked: null },
      ...records,
    ]),
  );
  // The gateway's ledger is the seeded file beside its keys file.
  for (const suffix of ['', '-wal', '-shm']) if (existsSync(`${path}${suffix}`)) renameSync(`${path}${suffix}`, `${keysPath}.usage.sqlite${suffix}`);
  const up = await startUpstreamProcess(secrets, 1_000);
  const g = await keyward(up.port, secrets, keysPath, 'keyward', { KEYWARD_LOG_LEVEL: 'warn' });
  try {
    const proxied = async (ms: number): Promise<number[]> => {
      const out: number[] = [];
      const until = performance.now() + ms;
      while (performance.now() < until) {
        const r = await timed(`${g.base}/seo/v3/appendix/user_data`, { authorization: `Bearer ${secrets.clientToken}` });
        if (r.status !== 200) throw new Error(`proxied request: ${r.status}`);
        out.push(r.ms);
      }
      return out.sort((a, b) => a - b);
    };
    await proxied(1_000); // warm
    const alone = await proxied(4_000);
    let rendering = true;
    let pages = 0;
    let busy = 0;
    const pageMs: number[] = [];
    const loops = ['', 'key=client-42', 'route=seo'].map(async (q) => {
      while (rendering) {
        const r = await timed(`${g.admin as string}/usage?${q}`, {});
        if (r.status === 200) {
          pages++;
          pageMs.push(r.ms);
        } else if (r.status === 503) busy++;
        else throw new Error(`usage page: ${r.status}`);
      }
    });
    await new Promise((r) => setTimeout(r, 500));
    const during = await proxied(4_000);
    rendering = false;
    await Promise.all(loops);
    pageMs.sort((a, b) => a - b);
    log(
      `proxied GET, one at a time: alone p50 ${p(alone, 0.5).toFixed(2)} ms, p99 ${p(alone, 0.99).toFixed(2)} ms, max ${(alone.at(-1) ?? 0).toFixed(1)} ms (${alone.length} requests)`,
    );
    log(
      `  while 3 views of the page render in a loop: p50 ${p(during, 0.5).toFixed(2)} ms, p99 ${p(during, 0.99).toFixed(2)} ms (${(p(during, 0.99) / p(alone, 0.99)).toFixed(2)}x alone), max ${(during.at(-1) ?? 0).toFixed(1)} ms (${during.length} requests); ${pages} pages, median ${p(pageMs, 0.5).toFixed(0)} ms each, ${busy} turned away busy`,
    );
  } finally {
    await g.stop();
    await up.stop();
  }
}

const { values: args } = parseArgs({
  options: { keys: { type: 'string', default: '10000' }, days: { type: 'string', default: '365' }, limited: { type: 'string', default: '0.33' } },
});
const KEYS = Number(args.keys);
const DAYS = Number(args.days);
/** The share of keys with a quota or budget. */
const LIMITED = Number(args.limited);
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
      insert.run(
        `key_${k.toString(16).padStart(12, '0')}`,
        route,
        day,
        requests,
        requests,
        route === 'scraper' ? 0 : requests * (route === 'seo' ? 0.002 : 40),
      );
    }
  }
  db.exec('commit');
  db.close();
  log(
    `seeded ${(KEYS * DAYS).toLocaleString('en')} rows in ${((performance.now() - at) / 1000).toFixed(1)} s (${(statSync(path).size / 1024 ** 2).toFixed(0)} MB)`,
  );

  const records: KeyRecord[] = Array.from({ length: KEYS }, (_, k) => ({
    id: `key_${k.toString(16).padStart(12, '0')}`,
    name: `client-${k}`,
    digest: `sha256:${'0'.repeat(64)}`,
    created: '2026-01-01T00:00:00Z',
    expires: null,
    revoked: null,
    ...(k % 100 < LIMITED * 100 ? { limits: k % 2 === 0 ? { quota: '40/day' } : { budgets: { speech: '1000/day' } } } : {}),
  }));
  const store = new SqliteUsageStore(path);
  const page = usagePage(
    store,
    () => records,
    ROUTES,
    (r) => (r === 'seo' ? 'usd' : r === 'speech' ? 'characters' : null),
    renderPage,
  );
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
    log(
      `${what}: median ${runs[2]?.toFixed(0)} ms (${runs[0]?.toFixed(0)}–${runs[4]?.toFixed(0)}), ${(bytes / 1024).toFixed(0)} KiB; longest event-loop stall median ${stalls[2]?.toFixed(0)} ms (${stalls[0]?.toFixed(0)}–${stalls[4]?.toFixed(0)})`,
    );
  };
  log(`# usage page, ${KEYS.toLocaleString('en')} keys × ${DAYS} days; ${machine()}`);
  await time('every key', {});
  await time('one key', { key: 'client-42' });
  await time('one route', { route: 'seo' });
  await store.close();
  await alongside(records);
} finally {
  rmSync(dir, { recursive: true, force: true });
}
