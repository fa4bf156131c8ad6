// Across a fleet, quotas overshot by design: each gateway read the fleet's
// totals at its flushes, and three gateways sent 46 of 60 requests through a
// `30/day` quota. Gateways now admit from leases claimed in PostgreSQL
// (docs/limits.md, "Across a fleet"): the fleet never admits more than the
// quota, a drained gateway gives back its unused units at once, a dead one's
// stay granted (never handed out twice), and the database's clock decides the
// period whatever a gateway's own clock says.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { createKey } from '../../src/keys/manage.ts';
import { PgKeyStore } from '../../src/keys/pg-store.ts';
import { createLogger } from '../../src/observe/log.ts';
import { createGateway, type Gateway } from '../../src/process/server.ts';
import { Clock } from '../../src/limits/leases.ts';
import { runCli } from '../support/cli.ts';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf, type FleetGateway } from '../support/fleet.ts';
import { startDatabase, type TestDatabase } from '../support/postgres.ts';
import { startUpstream, type MockUpstream } from '../support/upstream.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

interface InProcess {
  readonly url: string;
  readonly gateway: Gateway;
  readonly store: PgKeyStore;
}

/** A gateway in this process on the test database, with its own clock. */
async function inProcess(db: TestDatabase, up: MockUpstream, dir: string, clock?: Clock): Promise<InProcess> {
  const env = {
    KEYWARD_DATABASE_URL: db.url,
    KEYWARD_PORT: '0',
    KEYWARD_ADMIN_PORT: 'off',
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_USAGE_FLUSH: '200ms',
    // Exactness under overlap is measured here, not how long a claim may take on a loaded machine (fleet-budget-attacks.test.ts).
    KEYWARD_ADMISSION_WAIT: '10s',
  };
  const config = loadConfig(env, (p) => readFileSync(p, 'utf8'), dir, UPSTREAMS);
  const store = new PgKeyStore(db.url, costRoutes(UPSTREAMS));
  const sink = new Writable({ write: (_c, _e, cb) => cb() });
  const gateway = await createGateway(config, store, createLogger('info', sink).logger, clock === undefined ? {} : { clock });
  const address = await gateway.listen();
  return { url: `http://127.0.0.1:${address.port}`, gateway, store };
}

/** Stop the in-process gateways, then what they used. */
async function stopAll(gateways: readonly InProcess[], up: MockUpstream, db: TestDatabase, dir: string): Promise<void> {
  for (const g of gateways) {
    await g.gateway.shutdown();
    await g.store.close().catch(() => undefined);
  }
  await up.close();
  await db.close();
  rmSync(dir, { recursive: true, force: true });
}

test(
  'three gateways, a 30/day quota, 60 overlapping requests spread over them: exactly 30 forwarded, and the ledger holds 30',
  { timeout: 120_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream(async (req, res) => {
      req.resume();
      await sleep(50);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{}');
    });
    const dir = mkdtempSync(join(tmpdir(), 'keyward-leases-'));
    const gateways: InProcess[] = [];
    try {
      const admin = new PgKeyStore(db.url, costRoutes(UPSTREAMS));
      const { token } = await createKey(admin, 'q', { limits: { quota: '30/day' } });
      for (let i = 0; i < 3; i++) gateways.push(await inProcess(db, up, dir));
      await eventually(() => gateways.every((g) => g.gateway.keyCount() === 1), 5_000, 'key loaded');
      const statuses = await Promise.all(
        Array.from({ length: 60 }, (_, i) =>
          request(`${(gateways[i % 3] as InProcess).url}/seo/v3/r${i}`, { headers: { authorization: `Bearer ${token}` } }).then((r) => r.status),
        ),
      );
      const byGateway = gateways.map((_, g) => statuses.filter((s, i) => i % 3 === g && s === 200).length);
      assert.equal(statuses.filter((s) => s === 200).length, 30, `forwarded ${byGateway.join(' + ')}: ${statuses.join(',')}`);
      assert.equal(statuses.filter((s) => s === 429).length, 30);
      assert.equal(up.requests.length, 30);
      for (const g of gateways) await g.gateway.shutdown();
      const [row] = await db.admin<Array<{ n: number }>>`select coalesce(sum(requests), 0)::int as n from keyward_usage`;
      assert.equal(row?.n, 30, 'the ledger equals what the upstream received');
      const [leased] = await db.admin<Array<{ n: number }>>`select count(*)::int as n from keyward_leases`;
      assert.equal(leased?.n, 0, 'drained gateways hold no lease');
      const [granted] = await db.admin<Array<{ g: number }>>`select granted as g from keyward_allowances where kind = 'quota'`;
      assert.equal(granted?.g, 30, 'what was used stays granted; nothing unused is left out');
      console.log(`leases: 30 of 60 forwarded through a 30/day quota on three gateways (${byGateway.join(' + ')})`);
      await admin.close();
    } finally {
      await stopAll(gateways, up, db, dir);
    }
  },
);

test('a gateway whose clock is past UTC midnight reads the period from the database: no fresh daily quota', { timeout: 120_000 }, async () => {
  const db = await startDatabase();
  const up = await startUpstream();
  const dir = mkdtempSync(join(tmpdir(), 'keyward-clock-'));
  const gateways: InProcess[] = [];
  try {
    const admin = new PgKeyStore(db.url, costRoutes(UPSTREAMS));
    const { token } = await createKey(admin, 'd', { limits: { quota: '10/day' } });
    const now = Date.now();
    const pastMidnight = Date.UTC(new Date(now).getUTCFullYear(), new Date(now).getUTCMonth(), new Date(now).getUTCDate() + 1, 0, 1) - now;
    gateways.push(await inProcess(db, up, dir));
    gateways.push(await inProcess(db, up, dir, new Clock(() => Date.now() + pastMidnight)));
    const [honest, ahead] = gateways as [InProcess, InProcess];
    await eventually(() => honest.gateway.keyCount() === 1 && ahead.gateway.keyCount() === 1, 5_000, 'key loaded');
    const call = async (g: InProcess): Promise<number> => (await request(`${g.url}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status;
    const first: number[] = [];
    for (let i = 0; i < 10; i++) first.push(await call(honest));
    assert.deepEqual(first, Array(10).fill(200));
    const second: number[] = [];
    for (let i = 0; i < 10; i++) second.push(await call(ahead));
    assert.deepEqual(second, Array(10).fill(429), 'the gateway ahead of midnight sees the same day');
    await admin.close();
  } finally {
    await stopAll(gateways, up, db, dir);
  }
});

test(
  "a drained gateway gives its unused units back at once; a killed one's stay granted after its lease is swept; never more than the quota",
  { timeout: 120_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream();
    const env = {
      KEYWARD_DATABASE_URL: db.url,
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
      KEYWARD_ADMIN_PORT: 'off',
      KEYWARD_USAGE_FLUSH: '200ms',
      KEYWARD_LEASE_TTL: '3s',
    };
    const running: FleetGateway[] = [];
    const start = async (): Promise<FleetGateway> => {
      const g = await startFleetGateway(env);
      running.push(g);
      return g;
    };
    try {
      assert.equal((await runCli(['db', 'migrate'], env)).code, 0);
      const create = async (name: string, quota: number): Promise<{ id: string; token: string }> =>
        JSON.parse((await runCli(['keys', 'create', '--name', name, '--quota', `${quota}/day`, '--json'], env)).stdout) as { id: string; token: string };
      const lease = async (keyId: string): Promise<Array<{ held: number; used: number }>> => [
        ...(await db.admin<Array<{ held: number; used: number }>>`select held, used from keyward_leases where key_id = ${keyId}`),
      ];
      const count = async (g: FleetGateway, token: string, n: number): Promise<number> => {
        let ok = 0;
        for (let i = 0; i < n; i++) if ((await statusOf(g.base, token)) === 200) ok++;
        return ok;
      };

      // Drain: one request on A (it claims a chunk), SIGTERM, and B may use everything else at once.
      const drained = await create('drained', 12);
      const a = await start();
      assert.equal(await statusOf(a.base, drained.token), 200);
      const claimed = (await lease(drained.id))[0]?.held ?? 0;
      assert.ok(claimed > 1, `A claimed a chunk (${claimed})`);
      assert.equal((await a.stop()).code, 0);
      assert.deepEqual(await lease(drained.id), [], 'its lease ended at the drain');
      const b = await start();
      assert.equal(await count(b, drained.token, 14), 11, 'the drained units were at once for the others to use, and no more');

      // Kill: C takes a chunk and reports its use; SIGKILL. What C held stays
      // granted after its lease expired and was swept: C may have admitted from
      // it after its last report, so none of it is handed out again.
      const killed = await create('killed', 40);
      const c = await start();
      assert.equal(await statusOf(c.base, killed.token), 200);
      await eventually(async () => (await lease(killed.id))[0]?.used === 1, 5_000, 'C reported its use');
      const held = (await lease(killed.id))[0]?.held ?? 0;
      assert.ok(held > 1, `C holds a chunk (${held})`);
      c.kill();
      assert.equal(await count(b, killed.token, 45), 40 - held, "while C's lease lives its units stay out");
      await eventually(
        async () => (await db.admin`select 1 from keyward_leases where key_id = ${killed.id} and held = ${held}`).length === 0,
        10_000,
        "C's lease swept after KEYWARD_LEASE_TTL",
      );
      assert.equal(await count(b, killed.token, 5), 0, 'its unused units stay granted: never more than the quota, whatever C admitted after its last report');
      const [granted] = await db.admin<Array<{ granted: number }>>`select granted from keyward_allowances where key_id = ${killed.id} and kind = 'quota'`;
      assert.equal(granted?.granted, 40);
      assert.equal(up.requests.length, 12 + 40 - (held - 1));
      console.log(`leases: a drained gateway's units back at once; a killed gateway's ${held - 1} unused units stay granted (the bound a crash may cost)`);
    } finally {
      for (const g of running) await g.stop().catch(() => g.kill());
      await up.close();
      await db.close();
    }
  },
);

test('with PostgreSQL unreachable a gateway admits what its lease still holds, and no more', { timeout: 120_000 }, async () => {
  const db = await startDatabase();
  const up = await startUpstream();
  const { startTcpProxy } = await import('../support/tcp-proxy.ts');
  const proxy = await startTcpProxy(Number(new URL(db.url).port));
  const via = new URL(db.url);
  via.port = String(proxy.port);
  const direct = { KEYWARD_DATABASE_URL: db.url };
  const env = {
    KEYWARD_DATABASE_URL: via.toString(),
    KEYWARD_DATABASE_TIMEOUT: '1s',
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_ADMIN_PORT: 'off',
    KEYWARD_USAGE_FLUSH: '200ms',
  };
  let g: FleetGateway | null = null;
  try {
    assert.equal((await runCli(['db', 'migrate'], direct)).code, 0);
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'k', '--quota', '40/day', '--json'], direct)).stdout) as { id: string; token: string };
    g = await startFleetGateway(env);
    assert.equal(await statusOf(g.base, key.token), 200);
    const [lease] = await db.admin<Array<{ held: number }>>`select held from keyward_leases where key_id = ${key.id}`;
    const held = lease?.held ?? 0;
    assert.ok(held > 1, `a chunk held (${held})`);
    proxy.freeze();
    const statuses: number[] = [];
    for (let i = 0; i < held + 5; i++) statuses.push(await statusOf(g.base, key.token));
    assert.equal(statuses.filter((s) => s === 200).length, held - 1, `what the lease held, no more: ${statuses.join(',')}`);
    // More needs the store, which does not answer: 503 ledger_unavailable within the admission wait, not a quota refused.
    assert.equal(statuses.filter((s) => s === 503).length, 6);
    assert.equal(up.requests.length, held);
  } catch (e) {
    // What the gateway said, to read why (it never logs a secret).
    console.log(`the gateway's output:\n${g?.output() ?? ''}`);
    throw e;
  } finally {
    proxy.heal();
    await g?.stop().catch(() => g?.kill());
    await proxy.close();
    await up.close();
    await db.close();
  }
});
