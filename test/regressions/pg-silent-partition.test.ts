// A silent partition between a gateway and PostgreSQL: the path holds every
// byte and never errors. The watch's queries had no deadline and ran one at
// a time, so the gateway stayed "ready" and kept serving a revoked key for as
// long as the partition lasted, and a drain waited on the ledger for ever.
// Now every query has a deadline (KEYWARD_DATABASE_TIMEOUT), a store that
// does not answer is down, and a drain ends by its deadline with what it
// could not write kept on disk (docs/fleet.md, "Deadlines").
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { runCli } from '../support/cli.ts';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf } from '../support/fleet.ts';
import { startDatabase } from '../support/postgres.ts';
import { startTcpProxy } from '../support/tcp-proxy.ts';
import { startUpstream } from '../support/upstream.ts';

const DEADLINE_MS = 1_000;
const STALENESS_MS = 3_000;

function throughProxy(url: string, port: number): string {
  const u = new URL(url);
  u.port = String(port);
  return u.toString();
}

test(
  'a silent partition: readiness stale within the deadline, a revoked key refused once the staleness limit passed, fresh again when it heals',
  { timeout: 120_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream();
    const proxy = await startTcpProxy(Number(new URL(db.url).port));
    const direct = { KEYWARD_DATABASE_URL: db.url };
    const env = {
      KEYWARD_DATABASE_URL: throughProxy(db.url, proxy.port),
      KEYWARD_DATABASE_TIMEOUT: `${DEADLINE_MS}ms`,
      KEYWARD_KEYS_MAX_STALENESS: `${STALENESS_MS}ms`,
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
    };
    assert.equal((await runCli(['db', 'migrate'], direct)).code, 0);
    const alice = JSON.parse((await runCli(['keys', 'create', '--name', 'alice', '--json'], direct)).stdout) as { token: string };
    // A second key stays active, so that readiness speaks of the store alone once alice is revoked.
    assert.equal((await runCli(['keys', 'create', '--name', 'carol'], direct)).code, 0);
    const g = await startFleetGateway(env);
    try {
      await eventually(async () => (await statusOf(g.base, alice.token)) === 200, 5_000, 'alice served');
      const ready = async (): Promise<{ ready: boolean; stale?: boolean }> =>
        (await request(`${g.admin as string}/readyz`)).json() as { ready: boolean; stale?: boolean };
      assert.equal((await ready()).stale, undefined);

      proxy.freeze();
      const frozenAt = performance.now();
      await db.admin`update keyward_keys set revoked = now() where name = 'alice'`;
      await eventually(async () => (await ready()).stale === true, DEADLINE_MS + 3_000, 'readiness stale within the deadline (plus one check)');
      const staleMs = performance.now() - frozenAt;
      assert.match((await request(`${g.admin as string}/metrics`)).body.toString(), /^keyward_keystore_up 0$/m);
      await eventually(
        async () => (await statusOf(g.base, alice.token)) !== 200,
        DEADLINE_MS + STALENESS_MS + 4_000,
        'the revoked key refused once the staleness limit passed',
      );
      const refusedMs = performance.now() - frozenAt;
      assert.equal(await statusOf(g.base, alice.token), 503, 'keystore_unavailable while the store is unreachable');
      assert.ok(refusedMs >= STALENESS_MS, `not before the staleness limit (${refusedMs.toFixed(0)} ms)`);

      proxy.heal();
      const healedAt = performance.now();
      await eventually(async () => (await statusOf(g.base, alice.token)) === 401, 10_000, 'the revocation in force once the partition healed');
      const backMs = performance.now() - healedAt;
      await eventually(async () => (await ready()).stale === undefined && (await ready()).ready, 5_000, 'fresh again');
      console.log(
        `silent partition: stale after ${staleMs.toFixed(0)} ms, revoked key refused after ${refusedMs.toFixed(0)} ms (deadline ${DEADLINE_MS} ms, staleness ${STALENESS_MS} ms), revocation in force ${backMs.toFixed(0)} ms after it healed`,
      );
    } finally {
      await g.stop().catch(() => g.kill());
      await proxy.close();
      await up.close();
      await db.close();
    }
  },
);

test(
  'SIGTERM during a silent partition ends within the drain deadline; the usage it could not write is kept on disk and written once at the next start',
  { timeout: 120_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream();
    const proxy = await startTcpProxy(Number(new URL(db.url).port));
    const dir = mkdtempSync(join(tmpdir(), 'keyward-spool-'));
    const direct = { KEYWARD_DATABASE_URL: db.url, KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const drainMs = 3_000;
    const env = {
      ...direct,
      KEYWARD_DATABASE_URL: throughProxy(db.url, proxy.port),
      KEYWARD_DATABASE_TIMEOUT: `${DEADLINE_MS}ms`,
      KEYWARD_DRAIN_TIMEOUT: `${drainMs}ms`,
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
      KEYWARD_ADMIN_PORT: 'off',
    };
    try {
      assert.equal((await runCli(['db', 'migrate'], direct)).code, 0);
      const bob = JSON.parse((await runCli(['keys', 'create', '--name', 'bob', '--json'], direct)).stdout) as { token: string };
      const g = await startFleetGateway(env);
      await eventually(async () => (await statusOf(g.base, bob.token)) === 200, 5_000, 'bob served');
      proxy.freeze();
      // The last good set serves (no staleness limit): these are forwarded and counted, and cannot be written.
      for (let i = 0; i < 19; i++) assert.equal(await statusOf(g.base, bob.token), 200);
      const { code, ms } = await g.stop(drainMs + 10_000);
      assert.equal(code, 0);
      assert.ok(ms < drainMs + 3_000, `SIGTERM took ${ms.toFixed(0)} ms with a ${drainMs} ms drain deadline`);
      const kept = readdirSync(dir).filter((n) => n.startsWith('keys.json.usage-unwritten.'));
      assert.equal(kept.length, 1, `one file of unwritten usage: ${readdirSync(dir).join(', ')}`);
      const file = join(dir, kept[0] as string);
      const requestsKept = (JSON.parse(readFileSync(file, 'utf8')) as { batches: Array<{ rows: Array<{ requests: number }> }> }).batches
        .flatMap((b) => b.rows)
        .reduce((n, r) => n + r.requests, 0);
      assert.ok(requestsKept >= 19, `the file holds what was not written (${requestsKept})`);
      assert.match(g.output(), /"msg":"usage not written before the drain deadline; kept on disk and written at the next start"/);

      proxy.heal();
      const next = await startFleetGateway({ ...env, KEYWARD_DATABASE_URL: db.url });
      await eventually(() => !existsSync(file), 5_000, 'the kept usage written and its file removed');
      assert.equal((await next.stop()).code, 0);
      const rows = JSON.parse((await runCli(['usage', '--json', '--key', 'bob'], direct)).stdout) as Array<{ requests: number }>;
      assert.equal(
        rows.reduce((n, r) => n + r.requests, 0),
        20,
        'every forwarded request in the ledger once: none lost, none doubled',
      );
      console.log(
        `SIGTERM during a partition: exit after ${ms.toFixed(0)} ms (drain deadline ${drainMs} ms); ${requestsKept} requests kept on disk, written at the next start`,
      );
    } finally {
      await proxy.close();
      await up.close();
      await db.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(
  'a key asking where it stands during a silent partition: answered within the deadline from the rows last read, marked stale; fresh again when it heals',
  { timeout: 120_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream();
    const proxy = await startTcpProxy(Number(new URL(db.url).port));
    const direct = { KEYWARD_DATABASE_URL: db.url };
    // A flush interval short enough that each status reads the store again.
    const env = {
      KEYWARD_DATABASE_URL: throughProxy(db.url, proxy.port),
      KEYWARD_DATABASE_TIMEOUT: '20s',
      KEYWARD_USAGE_FLUSH: '200ms',
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
      KEYWARD_ADMIN_PORT: 'off',
    };
    assert.equal((await runCli(['db', 'migrate'], direct)).code, 0);
    const dana = JSON.parse((await runCli(['keys', 'create', '--name', 'dana', '--quota', '100/day', '--json'], direct)).stdout) as { token: string };
    const g = await startFleetGateway(env);
    type Status = { stale?: boolean; asOf?: string | null; usage: { today: { routes: Record<string, { requests: number }> } } };
    const status = async (): Promise<{ ms: number; body: Status }> => {
      const t = performance.now();
      const r = await request(`${g.base}/keyward/key`, { headers: { authorization: `Bearer ${dana.token}` } });
      assert.equal(r.status, 200);
      return { ms: performance.now() - t, body: r.json() as Status };
    };
    try {
      for (let i = 0; i < 3; i++) assert.equal(await statusOf(g.base, dana.token), 200);
      await eventually(async () => (await status()).body.usage.today.routes.seo?.requests === 3, 5_000, 'three requests read back from the store');
      // A read after this gateway's own flush of them: the rows last read are all three.
      await new Promise((r) => setTimeout(r, 500));
      const before = await status();
      assert.equal(before.body.usage.today.routes.seo?.requests, 3);
      assert.equal(before.body.stale, undefined);

      proxy.freeze();
      await new Promise((r) => setTimeout(r, 300)); // past the flush interval: the next status reads the store again
      assert.equal(await statusOf(g.base, dana.token), 200, 'the request path does not wait on the frozen store');
      const during = await status();
      assert.equal(during.body.stale, true, 'said to be stale');
      assert.equal(typeof during.body.asOf, 'string');
      assert.ok(during.ms < 3_000, `answered within the deadline, not the database's (${during.ms.toFixed(0)} ms)`);
      assert.equal(during.body.usage.today.routes.seo?.requests, 4, "the rows last read plus this gateway's own not written since");

      proxy.heal();
      await eventually(async () => (await status()).body.stale === undefined, 10_000, 'fresh again once healed');
      console.log(`status during a partition: stale answer in ${during.ms.toFixed(0)} ms`);
    } finally {
      await g.stop().catch(() => g.kill());
      await proxy.close();
      await up.close();
      await db.close();
    }
  },
);
