// Another process holding the SQLite ledger's write lock stalled the whole
// gateway: the flush waited on busy_timeout, synchronously, on the event
// loop (16 requests in 15 s, 20 s latency). A flush now fails at once on a
// locked file and is sent again later; requests never wait for it.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { DatabaseSync } from 'node:sqlite';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';
import { SqliteUsageStore } from '../../src/ledger/sqlite-store.ts';

const HOLD_MS = 3_000;

test('a second process holding the ledger write lock does not stall requests; the counts arrive once the lock is gone', { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-locked-'));
  const path = join(dir, 'usage.sqlite');
  const up = await startUpstream();
  // The store exists first, with its tables, as a running gateway's would.
  await new SqliteUsageStore(path).close();
  const gw = await startGateway({ seo: up.url, usageStore: new SqliteUsageStore(path), env: { KEYWARD_USAGE_FLUSH: '100ms' } });
  // The holder waits for the gateway's own flush to end (busy timeout): its
  // `begin immediate` may meet one, every 100 ms.
  const holder = spawn(
    process.execPath,
    [
      '-e',
      `const { DatabaseSync } = require('node:sqlite'); const db = new DatabaseSync(${JSON.stringify(path)}, { timeout: 5000 }); db.exec('begin immediate'); db.exec("insert into usage (key_id, route, day) values ('other', 'seo', '2000-01-01')"); console.log('locked'); setTimeout(() => { db.exec('commit'); db.close(); }, ${HOLD_MS});`,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  try {
    await deadline(new Promise<void>((resolve) => holder.stdout.on('data', (d: Buffer) => d.toString().includes('locked') && resolve())), 10_000, 'lock held');
    const started = performance.now();
    let worst = 0;
    let n = 0;
    while (performance.now() - started < HOLD_MS - 500) {
      const at = performance.now();
      assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status, 200);
      worst = Math.max(worst, performance.now() - at);
      n++;
    }
    // Each flush meets the lock (every 100 ms): none may hold a request for the lock's duration.
    assert.ok(worst < HOLD_MS / 2, `worst request took ${worst.toFixed(0)} ms while the lock was held`);
    await deadline(new Promise((r) => holder.on('exit', r)), 10_000, 'lock released');
    const read = new DatabaseSync(path, { readOnly: true });
    try {
      await eventually(
        () => (read.prepare(`select coalesce(sum(requests), 0) as n from usage where key_id = ?`).get(gw.keyId) as { n: number }).n === n,
        5_000,
        `all ${n} requests written once the lock was gone`,
      );
    } finally {
      read.close();
    }
    console.log(`ledger locked by another process for ${HOLD_MS} ms: ${n} requests served, worst ${worst.toFixed(1)} ms`);
  } finally {
    holder.kill();
    await gw.close();
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
