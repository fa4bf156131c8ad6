// A ledger flush whose commit reached PostgreSQL but whose reply was lost
// was written again by the next flush: 60 forwarded, 77 in the ledger. Each
// batch is now applied once (docs/limits.md, "The usage ledger"): sent again
// after the lost reply, it is recognised and skipped.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { runCli } from '../support/cli.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf } from '../support/fleet.ts';
import { startDatabase } from '../support/postgres.ts';
import { startTcpProxy } from '../support/tcp-proxy.ts';
import { startUpstream } from '../support/upstream.ts';

test('a flush committed whose reply never came is sent again and counted once', { timeout: 120_000 }, async () => {
  const db = await startDatabase();
  const up = await startUpstream();
  const proxy = await startTcpProxy(Number(new URL(db.url).port));
  const dir = mkdtempSync(join(tmpdir(), 'keyward-lost-reply-'));
  const direct = { KEYWARD_DATABASE_URL: db.url, KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
  const via = new URL(db.url);
  via.port = String(proxy.port);
  const env = {
    ...direct,
    KEYWARD_DATABASE_URL: via.toString(),
    KEYWARD_DATABASE_TIMEOUT: '3s',
    KEYWARD_USAGE_FLUSH: '200ms',
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_ADMIN_PORT: 'off',
  };
  try {
    assert.equal((await runCli(['db', 'migrate'], direct)).code, 0);
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'k', '--json'], direct)).stdout) as { id: string; token: string };
    const g = await startFleetGateway(env);
    try {
      const stored = async (): Promise<number> =>
        (await db.admin<Array<{ n: number }>>`select coalesce(sum(requests), 0)::int as n from keyward_usage where key_id = ${key.id}`)[0]?.n ?? 0;
      for (let i = 0; i < 10; i++) assert.equal(await statusOf(g.base, key.token), 200);
      await eventually(async () => (await stored()) === 10, 5_000, 'the first ten written');
      // The next flush goes through and commits; the reply to its COMMIT is lost.
      // Statements are prepared once, so their text is not sent again: the array of days among
      // a flush's parameters marks its connection (nothing else sends one), and what that
      // connection sends next is the transaction's COMMIT.
      proxy.loseReplyAfter(/[^]/, /\{"\d{4}-\d\d-\d\dT/);
      for (let i = 0; i < 7; i++) assert.equal(await statusOf(g.base, key.token), 200);
      await eventually(async () => (await stored()) === 17, 5_000, 'the second batch committed (its reply lost)');
      // The gateway gives up on the reply (its deadline), keeps the batch, and sends it again once the path is back.
      await eventually(() => g.output().includes('usage not written; kept and retried at every flush'), 10_000, 'the flush counted as failed');
      proxy.heal();
      for (let i = 0; i < 3; i++) assert.equal(await statusOf(g.base, key.token), 200);
      await eventually(() => g.output().includes('"msg":"usage written again"'), 15_000, 'written again');
      await eventually(async () => (await stored()) === 20, 5_000, 'the third batch written');
      assert.equal((await g.stop()).code, 0);
      assert.equal(await stored(), 20, 'twenty forwarded, twenty counted: the batch sent twice applied once');
      assert.equal(up.requests.length, 20);
    } finally {
      await g.stop().catch(() => g.kill());
    }
  } finally {
    await proxy.close();
    await up.close();
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
