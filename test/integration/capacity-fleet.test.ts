// docs/credentials.md, "Capacity", in a fleet: three gateways on one real
// PostgreSQL share each credential's concurrency through leases. A counting
// upstream records the most requests it ever had in flight on the account,
// through a gateway frozen (SIGSTOP) past the lease TTL, a database path cut
// silently, every database path frozen, and a gateway killed (SIGKILL).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { runCli } from '../support/cli.ts';
import { startFleetGateway, type FleetGateway } from '../support/fleet.ts';
import { startDatabase, type TestDatabase } from '../support/postgres.ts';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy.ts';
import { countingUpstream, type CountingUpstream } from '../support/counting-upstream.ts';

const SPEECH = '/speech/v1/text-to-speech/voice1';
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

interface Fixture {
  db: TestDatabase;
  up: CountingUpstream;
  token: string;
  gateways: FleetGateway[];
  proxies: TcpProxy[];
}

/** `count` gateways, each reaching the database through a TCP proxy of its own; the account allows `limit` at once. */
async function withCapacityFleet(
  count: number,
  limit: number,
  holdMs: number,
  run: (f: Fixture) => Promise<void>,
  extra: (i: number) => Record<string, string> = () => ({}),
): Promise<void> {
  const db = await startDatabase();
  const secret = `sk_FLEETCAP${randomBytes(5).toString('hex')}`;
  const up = await countingUpstream({ secrets: [secret], header: 'xi-api-key', allow: limit, holdMs });
  const dir = mkdtempSync(join(tmpdir(), 'keyward-capfleet-'));
  const gateways: FleetGateway[] = [];
  const proxies: TcpProxy[] = [];
  const dbPort = Number(new URL(db.url).port);
  const env = {
    KEYWARD_SPEECH_URL: up.url,
    KEYWARD_SPEECH_KEY: secret,
    KEYWARD_SPEECH_CONCURRENCY: String(limit),
    KEYWARD_QUEUE_WAIT: '30s',
    KEYWARD_LEASE_TTL: '2s',
    KEYWARD_DATABASE_TIMEOUT: '1s',
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
  };
  try {
    const created = await runCli(['keys', 'create', '--name', 'cap', '--json'], { ...env, KEYWARD_DATABASE_URL: db.url }, undefined, 120_000);
    assert.equal(created.code, 0, created.stderr);
    const token = (JSON.parse(created.stdout) as { token: string }).token;
    for (let i = 0; i < count; i++) {
      const proxy = await startTcpProxy(dbPort);
      proxies.push(proxy);
      const url = new URL(db.url);
      url.port = String(proxy.port);
      gateways.push(await startFleetGateway({ ...env, ...extra(i), KEYWARD_DATABASE_URL: url.href }));
    }
    await run({ db, up, token, gateways, proxies });
  } finally {
    await Promise.all(gateways.map((g) => g.stop().catch(() => g.kill())));
    await Promise.all(proxies.map((p) => p.close()));
    await up.close();
    await db.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

const post = (g: FleetGateway, token: string, who: string) =>
  request(`${g.base}${SPEECH}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'x-who': who },
    body: '{"text":"hello"}',
    timeoutMs: 40_000,
  });

test(
  'three gateways (one of them two workers), one account of concurrency 3: bursts on every gateway all answered, never more than 3 in flight, rebalanced by demand',
  { timeout: 180_000 },
  async () => {
    await withCapacityFleet(
      3,
      3,
      60,
      async ({ db, up, token, gateways }) => {
        const replies = await Promise.all(gateways.flatMap((g, gi) => Array.from({ length: 20 }, (_, i) => post(g, token, `g${gi}-${i}`))));
        assert.deepEqual(
          replies.map((r) => r.status),
          replies.map(() => 200),
        );
        assert.equal(up.refusedForConcurrency(), 0);
        assert.equal(up.most.get(1), 3);
        // Then only one gateway has demand: within a rebalance or two it holds the whole account.
        await sleep(1_000);
        up.most.clear();
        const alone = await Promise.all(Array.from({ length: 30 }, (_, i) => post(gateways[0] as FleetGateway, token, `alone${i}`)));
        assert.ok(alone.every((r) => r.status === 200));
        assert.equal(up.most.get(1), 3, 'one gateway alone used the whole account');
        // The gateway with workers: its primary holds the machine's lease; alone, it too gets the whole account.
        await sleep(1_000);
        up.most.clear();
        const machine = await Promise.all(
          Array.from({ length: 30 }, () =>
            request(`${(gateways[2] as FleetGateway).base}${SPEECH}`, {
              method: 'POST',
              headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', connection: 'close' },
              body: '{"text":"hello"}',
              timeoutMs: 40_000,
            }),
          ),
        );
        assert.ok(machine.every((r) => r.status === 200));
        assert.equal(up.most.get(1), 3, 'a machine of two workers alone used the whole account');
        assert.equal(up.refusedForConcurrency(), 0);
        // A gateway that drains gives its lease back: none of its rows is left for the TTL to end.
        const g1 = gateways[1] as FleetGateway;
        const rows = async (): Promise<number> =>
          (await db.admin<Array<{ n: number }>>`select count(*)::int as n from keyward_capacity_leases where gateway like ${`%:${g1.pid}:%`}`)[0]?.n ?? -1;
        const draining = Promise.all(Array.from({ length: 10 }, (_, i) => post(g1, token, `drain${i}`)));
        await eventually(async () => (await rows()) > 0, 10_000, 'the draining gateway holding a lease');
        // Every one of the ten taken in (forwarded, or waiting in its queue) before the stop, which closes the port to new connections.
        // Arrivals first: one forwarded between the two reads is then counted in neither, never twice.
        await eventually(
          async () => {
            const forwarded = up.arrivals.filter((a) => a.who.startsWith('drain')).length;
            const ready = (await request(`${g1.admin as string}/readyz`)).json() as { capacity?: Record<string, { queued: number }> };
            return forwarded + (ready.capacity?.speech?.queued ?? 0) === 10;
          },
          10_000,
          'the ten requests taken in',
        );
        assert.equal((await g1.stop()).code, 0);
        assert.ok((await draining).every((r) => r.status === 200));
        assert.equal(await rows(), 0);
      },
      (i): Record<string, string> => (i === 2 ? { KEYWARD_WORKERS: '2' } : {}),
    );
  },
);

test(
  'under faults (a gateway frozen past the lease TTL, a database path cut, every database path frozen, a gateway killed) the account never sees more than its limit',
  { timeout: 240_000 },
  async () => {
    await withCapacityFleet(3, 3, 100, async ({ up, token, gateways, proxies }) => {
      let running = true;
      const results = new Map<number, number>();
      const loops = gateways.flatMap((g, gi) =>
        Array.from({ length: 4 }, async (_, li) => {
          for (let n = 0; running; n++) {
            const status = await post(g, token, `g${gi}-${li}-${n}`).then(
              (r) => r.status,
              () => 0,
            );
            results.set(status, (results.get(status) ?? 0) + 1);
            if (status !== 200) await sleep(100);
          }
        }),
      );
      const [a, , c] = gateways as [FleetGateway, FleetGateway, FleetGateway];
      await sleep(2_000);
      // A gateway frozen with room leased and requests in flight, past the lease TTL (2 s).
      process.kill(c.pid, 'SIGSTOP');
      await sleep(4_000);
      process.kill(c.pid, 'SIGCONT');
      await sleep(2_000);
      // One gateway's database path cut silently.
      proxies[1]?.freeze();
      await sleep(4_000);
      proxies[1]?.heal();
      await sleep(2_000);
      // Every database path frozen: no gateway can renew.
      for (const p of proxies) p.freeze();
      await sleep(4_000);
      for (const p of proxies) p.heal();
      await sleep(2_000);
      // A gateway killed with requests in flight: its lease ends after the TTL and the others take its room.
      a.kill();
      await a.exited();
      const beforeKill = up.arrivals.length;
      await sleep(5_000);
      running = false;
      await Promise.all(loops);
      assert.equal(up.refusedForConcurrency(), 0, `the provider refused for concurrency; most in flight ${up.most.get(1)}`);
      assert.ok((up.most.get(1) ?? 0) <= 3, `most in flight ${up.most.get(1)}`);
      assert.ok((results.get(200) ?? 0) > 100, JSON.stringify([...results]));
      // The survivors served after the kill.
      assert.ok(up.arrivals.length - beforeKill > 10, `${up.arrivals.length - beforeKill} after the kill`);
      console.log(`capacity under faults: ${JSON.stringify(Object.fromEntries(results))}, most in flight ${up.most.get(1)} of 3`);
    });
  },
);
