// With KEYWARD_WORKERS=2 both workers drain at once and write the SQLite
// ledger together; SQLite refuses a second writer at once (no busy wait, so
// a flush never stalls the event loop), and a final write that met the other
// worker's lock was tried once more, at once, and then kept on disk for the
// next start: `keyward usage` after a clean stop missed those requests (seen
// under load as 2 of 4 forwarded requests in the ledger). A final write is
// now tried again for a moment before its counts are kept.
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { DatabaseSync } from 'node:sqlite';
import { Ledger } from '../../src/ledger/ledger.ts';
import { SqliteUsageStore } from '../../src/ledger/sqlite-store.ts';

test("a final ledger write that meets another writer's lock waits for it, and keeps nothing on disk", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-drain-lock-'));
  const path = join(dir, 'keys.json.usage.sqlite');
  const kept: string[] = [];
  const errors: Error[] = [];
  const ledger = new Ledger(new SqliteUsageStore(path), (err) => errors.push(err), undefined, {
    prefix: join(dir, 'keys.json.usage-unwritten'),
    onRead: () => undefined,
    onKept: (file) => kept.push(file),
  });
  const other = new DatabaseSync(path);
  try {
    await ledger.start(60_000);
    for (let i = 0; i < 4; i++) ledger.record('key_a', 'speech', 200, 10, 3, 10);
    // The other worker's write, holding the lock for a while (a loaded machine).
    other.exec('begin immediate');
    const released = new Promise<void>((resolve) =>
      setTimeout(() => {
        other.exec('commit');
        resolve();
      }, 300),
    );
    await ledger.stop(5_000);
    await released;
    assert.ok(errors.length > 0, 'the first try met the lock');
    assert.deepEqual(kept, [], 'nothing kept on disk for the next start');
    assert.deepEqual(
      readdirSync(dir).filter((f) => f.includes('unwritten')),
      [],
    );
    const row = other.prepare('select sum(requests) as n, sum(cost) as cost from usage where key_id = ?').get('key_a') as { n: number; cost: number };
    assert.deepEqual({ ...row }, { n: 4, cost: 40 });
  } finally {
    other.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
