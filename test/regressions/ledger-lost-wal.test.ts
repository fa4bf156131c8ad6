// A SQLite ledger in WAL mode keeps its recent commits in `-wal` until a
// checkpoint: with `-wal` removed, emptied or overwritten after a kill -9,
// a key whose 5/day quota was spent got 5 more on restart (the main file was
// 4 KiB with no tables while the gateway ran); a ledger file removed looked
// like a new one. Now the ledger's id and write count are remembered beside
// it (`.mark`), its schema and writes reach the main file at a stated
// interval, and a ledger that lost writes or is not the one remembered is
// damaged: 503 ledger_unavailable, readiness says why (docs/limits.md,
// "Limits under faults"; docs/operations.md, "Backing up the ledger").
import assert from 'node:assert/strict';
import { copyFileSync, existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli } from '../support/cli.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf, type FleetGateway } from '../support/fleet.ts';
import { startUpstream, type MockUpstream } from '../support/upstream.ts';

interface Setup {
  dir: string;
  up: MockUpstream;
  env: Record<string, string>;
  ledger: string;
  spent: string;
  free: string;
}

async function setup(): Promise<Setup> {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-wal-'));
  const up = await startUpstream();
  const keysFile = join(dir, 'keys.json');
  const env = { KEYWARD_KEYS_FILE: keysFile, KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p', KEYWARD_USAGE_FLUSH: '100ms' };
  const spent = (JSON.parse((await runCli(['keys', 'create', '--name', 'spent', '--quota', '5/day', '--json'], env)).stdout) as { token: string }).token;
  const free = (JSON.parse((await runCli(['keys', 'create', '--name', 'free', '--json'], env)).stdout) as { token: string }).token;
  return { dir, up, env, ledger: `${keysFile}.usage.sqlite`, spent, free };
}

/** The quota spent and flushed, then the gateway killed (-9): what it wrote is in the -wal file only. */
async function spendThenKill(s: Setup): Promise<void> {
  const g = await startFleetGateway(s.env);
  for (let i = 0; i < 5; i++) assert.equal(await statusOf(g.base, s.spent), 200);
  assert.equal(await statusOf(g.base, s.spent), 429);
  // Flushed: a reader sees the five (a read-only connection, which never checkpoints them into the main file).
  const counted = (): number => {
    const db = new DatabaseSync(s.ledger, { readOnly: true });
    try {
      return (db.prepare('select coalesce(sum(requests), 0) as n from usage').get() as { n: number }).n;
    } finally {
      db.close();
    }
  };
  await eventually(() => counted() === 5, 10_000, 'five counted in the ledger');
  g.kill();
  await g.exited();
}

async function refusedAfterRestart(s: Setup, problem: RegExp, env: Record<string, string> = {}): Promise<void> {
  const g: FleetGateway = await startFleetGateway({ ...s.env, ...env });
  try {
    const r = await request(`${g.base}/seo/v3/x`, { headers: { authorization: `Bearer ${s.spent}` } });
    assert.equal(r.status, 503, 'the spent quota is not granted again');
    assert.equal((r.json() as { code: string }).code, 'ledger_unavailable');
    assert.equal(await statusOf(g.base, s.free), 200, 'a key without limits is served');
    const ready = (await request(`${g.admin as string}/readyz`)).json() as { problem?: string };
    assert.match(ready.problem ?? '', problem);
    assert.equal(s.up.requests.length, 6, 'five for the spent key before, one for the free key');
  } finally {
    await g.stop().catch(() => g.kill());
  }
}

for (const [what, lose] of [
  ['removed', (wal: string) => rmSync(wal)],
  ['emptied', (wal: string) => writeFileSync(wal, '')],
  ['overwritten', (wal: string) => writeFileSync(wal, Buffer.alloc(statSync(wal).size, 0x5a))],
] as const) {
  test(`the -wal file ${what} after a kill -9: the ledger is damaged, never a fresh one; the spent quota stays spent`, { timeout: 90_000 }, async () => {
    const s = await setup();
    try {
      await spendThenKill(s);
      assert.ok(existsSync(`${s.ledger}-wal`) && statSync(`${s.ledger}-wal`).size > 0, 'the writes were in the -wal file');
      lose(`${s.ledger}-wal`);
      await refusedAfterRestart(s, /usage ledger .* cannot be read .*writes of the .* its mark remembers/);
    } finally {
      await s.up.close();
      rmSync(s.dir, { recursive: true, force: true });
    }
  });
}

// Round 4, point 6: with workers, every answer was right but /readyz said only "ready".
test(
  'the -wal and -shm files removed after a kill -9, restarted with KEYWARD_WORKERS=2: refused as damaged, and /readyz names the ledger',
  { timeout: 90_000 },
  async () => {
    const s = await setup();
    try {
      await spendThenKill(s);
      rmSync(`${s.ledger}-wal`);
      rmSync(`${s.ledger}-shm`, { force: true });
      await refusedAfterRestart(s, /usage ledger .* cannot be read/, { KEYWARD_WORKERS: '2' });
    } finally {
      await s.up.close();
      rmSync(s.dir, { recursive: true, force: true });
    }
  },
);

test('a ledger file removed or emptied where one was written is damaged, never a fresh ledger', { timeout: 90_000 }, async () => {
  const s = await setup();
  try {
    await spendThenKill(s);
    rmSync(s.ledger);
    rmSync(`${s.ledger}-wal`, { force: true });
    rmSync(`${s.ledger}-shm`, { force: true });
    await refusedAfterRestart(s, /the file is missing, though .*\.mark says a ledger was written here/);
  } finally {
    await s.up.close();
    rmSync(s.dir, { recursive: true, force: true });
  }
});

test(
  'a copy of the .sqlite file alone, taken after a drain, is the whole ledger: its schema and every flush reached the main file',
  { timeout: 90_000 },
  async () => {
    const s = await setup();
    try {
      const g = await startFleetGateway(s.env);
      for (let i = 0; i < 3; i++) assert.equal(await statusOf(g.base, s.spent), 200);
      // While the gateway runs, the main file already holds the schema.
      const running = new DatabaseSync(s.ledger, { readOnly: true });
      try {
        const tables = (running.prepare("select name from sqlite_master where type = 'table'").all() as Array<{ name: string }>).map((t) => t.name);
        assert.ok(tables.includes('usage') && tables.includes('allowances') && tables.includes('meta'), tables.join(','));
      } finally {
        running.close();
      }
      assert.equal((await g.stop()).code, 0);
      const copy = join(s.dir, 'backup.sqlite');
      copyFileSync(s.ledger, copy);
      const db = new DatabaseSync(copy, { readOnly: true });
      try {
        const row = db.prepare("select coalesce(sum(requests), 0) as n from usage where route = 'seo'").get() as { n: number };
        assert.equal(row.n, 3);
      } finally {
        db.close();
      }
    } finally {
      await s.up.close();
      rmSync(s.dir, { recursive: true, force: true });
    }
  },
);
