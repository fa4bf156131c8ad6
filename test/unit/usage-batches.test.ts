// Usage batches are applied once, whatever happens to a write's reply
// (docs/limits.md, "The ledger"), and a drain that cannot write keeps them
// on disk for the next start (docs/fleet.md, "Usage during an outage").
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { sinceDay } from '../../src/views/usage-report.ts';
import { UsageError } from '../../src/cli/args.ts';
import { PgKeyStore } from '../../src/keys/pg-store.ts';
import { sharedUsageStore } from '../../src/ledger/open.ts';
import type { PgUsageStore } from '../../src/ledger/pg-usage.ts';
import { toRecord, type Row } from '../../src/keys/pg-schema.ts';
import { recordProblem } from '../../src/keys/record.ts';
import { Ledger } from '../../src/ledger/ledger.ts';
import { MemoryUsageStore } from '../../src/ledger/memory-store.ts';
import { spoolPrefix } from '../../src/ledger/spool.ts';
import { SqliteUsageStore } from '../../src/ledger/sqlite-store.ts';
import { startDatabase } from '../support/postgres.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';
import type { BatchId, UsageRow } from '../../src/ledger/store.ts';
import { usageRow } from '../support/rows.ts';

const total = (rows: readonly UsageRow[]): number => rows.reduce((n, r) => n + r.requests, 0);
const row = (keyId: string, requests: number): UsageRow => usageRow({ keyId, day: '2026-11-24', requests });

/** A store whose writes reach it but whose first `lost` replies never come back as success. */
class LostReplies extends MemoryUsageStore {
  lost: number;
  constructor(lost: number) {
    super();
    this.lost = lost;
  }
  override async add(rows: readonly UsageRow[], batch: BatchId): Promise<void> {
    await super.add(rows, batch);
    if (this.lost-- > 0) throw new Error('connection reset after the commit');
  }
}

test('a flush whose commit reached the store but whose reply was lost is sent again and counted once', async () => {
  const store = new LostReplies(3);
  const errors: boolean[] = [];
  const ledger = new Ledger(store, (_err, first) => errors.push(first));
  await ledger.start(3_600_000);
  for (let round = 0; round < 5; round++) {
    for (let i = 0; i < 7; i++) ledger.record('key_a', 'seo', 200, 0, 0, 0);
    await ledger.flush();
  }
  await ledger.stop();
  assert.equal(total(await store.rows({})), 35, 'every request once');
  assert.deepEqual(errors, [true, false, false], 'the outage said once, every failed flush counted');
});

test('a drain whose store does not answer ends by its deadline and keeps the batches on disk; the next start writes them once', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-spool-unit-'));
  try {
    const prefix = spoolPrefix(join(dir, 'keys.json'));
    const kept: Array<{ file: string; requests: number }> = [];
    const spool = (onRead: (files: readonly string[], batches: number) => void = () => undefined) => ({
      prefix,
      onRead,
      onKept: (file: string, requests: number) => kept.push({ file, requests }),
    });
    // The first write is applied and its reply never comes; the store then hangs.
    const reached = new MemoryUsageStore();
    let calls = 0;
    const hanging = new MemoryUsageStore();
    hanging.add = async (rows, batch) => {
      if (calls++ === 0) await reached.add(rows, batch);
      return new Promise<void>(() => undefined);
    };
    const first = new Ledger(
      hanging,
      () => undefined,
      () => undefined,
      spool(),
    );
    await first.start(3_600_000);
    for (let i = 0; i < 4; i++) first.record('key_a', 'seo', 200, 0, 0, 0);
    void first.flush(); // reaches the store; no answer
    for (let i = 0; i < 6; i++) first.record('key_a', 'seo', 200, 0, 0, 0);
    const at = performance.now();
    await first.stop(300);
    assert.ok(performance.now() - at < 1_000, 'the drain deadline holds');
    assert.equal(kept.length, 1);
    assert.equal(kept[0]?.requests, 10, 'the batch in flight and the one not sent, kept');
    assert.equal(readdirSync(dir).length, 1);
    const mode = execFileSync('stat', ['-c', '%a', kept[0]?.file]).toString().trim();
    assert.equal(mode, '600');

    // The next start, against the store the first write did reach.
    const read: number[] = [];
    const second = new Ledger(
      reached,
      () => undefined,
      () => undefined,
      spool((_f, batches) => read.push(batches)),
    );
    await second.start(3_600_000);
    assert.deepEqual(read, [2]);
    assert.equal(total(await reached.rows({})), 10, 'applied once: the batch that had arrived is not counted again');
    assert.equal(second.requests('key_a', 'day', Date.now()), 10, 'and counted once in the period totals that limits read');
    assert.deepEqual(readdirSync(dir), [], 'the file goes once written');
    await second.stop();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a damaged spool file is left where it is and named; a batch of the wrong shape is set aside; the others are written', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-spool-bad-'));
  try {
    const prefix = spoolPrefix(join(dir, 'keys.json'));
    writeFileSync(`${prefix}.x.json`, '{"batches": [{"gateway": "x", "se');
    writeFileSync(`${prefix}.y.json`, JSON.stringify({ batches: [{ gateway: 'y', seq: 1, rows: [row('key_b', 3)] }] }));
    writeFileSync(
      `${prefix}.z.json`,
      JSON.stringify({
        batches: [
          { gateway: 'z', seq: 'one', rows: [] },
          { gateway: 'z', seq: 2, rows: [row('key_c', 4)] },
        ],
      }),
    );
    const store = new MemoryUsageStore();
    const bad: string[] = [];
    const aside: string[] = [];
    const ledger = new Ledger(
      store,
      () => undefined,
      () => undefined,
      { prefix, onRead: (_f, _n, b, s) => (bad.push(...b), aside.push(...s.flatMap((x) => x.reasons))), onKept: () => undefined },
    );
    await ledger.start(3_600_000);
    assert.deepEqual(bad, [`${prefix}.x.json`]);
    assert.deepEqual(aside, ['no gateway, number or rows']);
    assert.equal(total(await store.rows({})), 3 + 4);
    assert.deepEqual(readdirSync(dir).sort(), ['keys.json.usage-unwritten.x.json', 'keys.json.usage-unwritten.z.json.set-aside']);
    await ledger.stop();
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('PostgreSQL and SQLite apply a batch once: again, or an older one after a newer, changes nothing', { timeout: 60_000 }, async () => {
  const db = await startDatabase();
  const dir = mkdtempSync(join(tmpdir(), 'keyward-batches-'));
  const pg = new PgKeyStore(db.url, costRoutes(UPSTREAMS));
  try {
    for (const store of [sharedUsageStore(pg) as PgUsageStore, new SqliteUsageStore(join(dir, 'u.sqlite'))]) {
      await store.add([row('key_a', 2)], { gateway: 'g1', seq: 1 });
      await store.add([row('key_a', 2)], { gateway: 'g1', seq: 1 });
      await store.add([row('key_a', 5)], { gateway: 'g1', seq: 3 });
      await store.add([row('key_a', 100)], { gateway: 'g1', seq: 2 });
      await store.add([row('key_a', 7)], { gateway: 'g2', seq: 1 });
      assert.equal(total(await store.rows({})), 14, store.location);
      await store.close();
    }
  } finally {
    await pg.close();
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('SQLite on a full disk: the write fails with the cause ("database or disk is full"), not with the rollback that follows', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-full-'));
  try {
    try {
      execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=160k', 'tmpfs', dir], { stdio: 'ignore' });
    } catch {
      t.skip('a small file system cannot be mounted here (needs root and mount)');
      return;
    }
    try {
      const store = new SqliteUsageStore(join(dir, 'u.sqlite'));
      let failure: Error | null = null;
      for (let i = 1; i < 500 && failure === null; i++) {
        const rows = Array.from({ length: 200 }, (_, j) => row(`key_${i}_${j}_${'x'.repeat(40)}`, 1));
        failure = await store.add(rows, { gateway: 'g', seq: i }).then(
          () => null,
          (err: Error) => err,
        );
      }
      assert.ok(failure !== null, 'the disk filled');
      assert.match(failure.message, /database or disk is full/);
      await store.close();
    } finally {
      execFileSync('umount', [dir]);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('keyward usage --since: impossible days, year 0 and durations reaching before 1970 are refused', () => {
  const now = Date.parse('2026-11-24T10:00:00Z');
  assert.equal(sinceDay('7d', now, ''), '2026-11-17');
  assert.equal(sinceDay('2026-02-28', now, ''), '2026-02-28');
  assert.equal(sinceDay('1970-01-01', now, ''), '1970-01-01');
  for (const bad of ['99999999d', '0000-01-01', '1969-12-31', '2026-02-31', '2026-13-01', 'soon', '-3d']) {
    assert.throws(
      () => sinceDay(bad, now, ''),
      (err: Error) => err instanceof UsageError && /--since/.test(err.message),
      bad,
    );
  }
});

test('PostgreSQL instants as a record: infinity never expires, -infinity and BC are long past, what JavaScript cannot place fails the check', () => {
  const s = (ms: number): number => ms / 1000; // read as seconds
  const base: Row = {
    id: 'k',
    name: 'n',
    digest: `sha256:${'0'.repeat(64)}`,
    created: s(Date.parse('2026-01-01T00:00:00Z')),
    expires: null,
    revoked: null,
    routes: null,
    previous: [],
    limits: null,
    version: '1',
    h: '0',
  };
  const at = (over: Partial<Row>): ReturnType<typeof toRecord> => toRecord({ ...base, ...over });
  assert.equal(at({ expires: Infinity }).expires, null);
  assert.equal(recordProblem(at({ expires: Infinity }), costRoutes(UPSTREAMS)), null);
  assert.equal(at({ expires: -Infinity }).expires, '1970-01-01T00:00:00.000Z');
  assert.equal(at({ revoked: -Infinity }).revoked, '1970-01-01T00:00:00.000Z');
  assert.equal(at({ expires: s(Date.UTC(-43, 2, 15)) }).expires, '1970-01-01T00:00:00.000Z', '44 BC: long past, in a form PostgreSQL reads back');
  assert.match(recordProblem(at({ revoked: Infinity }), costRoutes(UPSTREAMS)) ?? '', /revoked must be a date/);
  assert.match(recordProblem(at({ expires: s(8.64e15 + 86_400_000) }), costRoutes(UPSTREAMS)) ?? '', /expires must be a date/);
  assert.match(recordProblem(at({ created: Infinity }), costRoutes(UPSTREAMS)) ?? '', /created must be a date/);
  assert.match(recordProblem(at({ created: s(Date.UTC(-43, 2, 15)) }), costRoutes(UPSTREAMS)) ?? '', /created must be a date/);
  // 1764000058.123 is 1764000058.12299990654… as a double: read through microseconds, never 122.
  assert.equal(at({ created: 1764000058.123 }).created, '2025-11-24T16:00:58.123Z');
  assert.equal(at({ created: 1764000058.123999 }).created, '2025-11-24T16:00:58.123Z', 'microseconds cut to milliseconds');
});
