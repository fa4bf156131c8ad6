// An alert whose firing could not be recorded was dropped until the key's
// next request. The SQLite ledger fails at once while another process holds
// its write lock (with KEYWARD_WORKERS, a worker's flush every interval), so
// a key driven to 100 % of its quota, whose further requests are refused and
// never counted, lost its `limit_reached` alert for good (CI met it as a
// two-worker alert that never fired). A check that meets a store failure is
// now made again, 250 ms doubling; docs/limits.md, "Alerts". (Quotas are
// leased from the same file before they are admitted, so while the lock is
// held only what the gateway's lease holds is admitted.)
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startReceiver } from '../support/receiver.ts';
import { parseProm } from '../support/prom.ts';
import { startUpstream } from '../support/upstream.ts';
import { SqliteUsageStore } from '../../src/ledger/sqlite-store.ts';

test('alerts crossed while another process holds the ledger write lock fire once the lock is gone', { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-alert-locked-'));
  const path = join(dir, 'usage.sqlite');
  const up = await startUpstream();
  const receiver = await startReceiver();
  // The store exists first, with its tables, as a running gateway's would.
  await new SqliteUsageStore(path).close();
  const gw = await startGateway({
    seo: up.url,
    usageStore: new SqliteUsageStore(path),
    limits: { quota: '10/day', alerts: [20, 30] },
    env: { KEYWARD_ALERT_WEBHOOK: receiver.url },
  });
  const send = async (): Promise<number> => (await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status;
  // The first request leases a chunk of the quota (a quarter of it, 3) from the file before the lock.
  assert.equal(await send(), 200);
  // The holder waits for a write of the gateway's own to end (busy timeout) before it takes the lock.
  const holder = spawn(
    process.execPath,
    [
      '-e',
      `const { DatabaseSync } = require('node:sqlite'); const db = new DatabaseSync(${JSON.stringify(path)}, { timeout: 5000 }); db.exec('begin immediate'); console.log('locked'); process.stdin.on('data', () => { db.exec('commit'); db.close(); process.exit(0); });`,
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  try {
    await deadline(new Promise<void>((resolve) => holder.stdout.on('data', (d: Buffer) => d.toString().includes('locked') && resolve())), 10_000, 'lock held');
    // What the lease holds is admitted while the lock is held (crossing 20 % and 30 %); no more
    // can be leased from a file another process holds, so the next is not decided (503
    // ledger_unavailable), never granted unleased.
    assert.equal(await send(), 200);
    assert.equal(await send(), 200);
    assert.equal(await send(), 503);
    // Checks that meet the lock are counted: two of them, and still nothing fired.
    const deferred = async (): Promise<number> => parseProm(await gw.gateway.metrics.text()).sum('keyward_limit_alert_checks_deferred_total', {});
    await eventually(async () => (await deferred()) >= 2, 10_000, 'two checks met the lock');
    assert.equal(receiver.got.length, 0, 'nothing fires while it cannot be recorded');
    holder.stdin.write('release\n');
    await deadline(new Promise((r) => holder.on('exit', r)), 10_000, 'lock released');
    await eventually(() => receiver.got.length >= 2, 15_000, 'both alerts once the lock is gone');
    // No check is due any more: whatever could fire has.
    await eventually(async () => parseProm(await gw.gateway.metrics.text()).sum('keyward_limit_alert_checks_pending', {}) === 0, 10_000, 'no check pending');
    assert.deepEqual(
      receiver.got.map((r) => [r.json.event, r.json.limit.threshold]),
      [
        ['threshold_crossed', 20],
        ['threshold_crossed', 30],
      ],
    );
    assert.equal(gw.logs().filter((l) => l.msg?.toString().startsWith('limit alert')).length, 2);
  } finally {
    holder.kill();
    await gw.close();
    await receiver.close();
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
