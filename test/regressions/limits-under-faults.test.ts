// Limits exact under faults (docs/limits.md, "Limits under faults"): a
// lease that expired while its gateway was alive (the database frozen, the
// gateway frozen, its database path cut) had its unused part given back to
// the allowance while the gateway kept admitting from it, and a gateway
// killed between two flushes took its admissions with it and its restart
// granted them again: 78 for 60, 68 for 50, 418 for 400, 60 for 30. Now an
// expired lease's units stay granted and one machine leases from its SQLite
// file before it admits: a fault may cost units refused, never a unit
// granted twice.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { runCli } from '../support/cli.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf, type FleetGateway } from '../support/fleet.ts';
import { startDatabase, type TestDatabase } from '../support/postgres.ts';
import { startTcpProxy, type TcpProxy } from '../support/tcp-proxy.ts';
import { startUpstream } from '../support/upstream.ts';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** Requests spread over `targets` (round robin), `parallel` at a time, until `stop()` says so; the number that got 200. */
async function traffic(targets: () => string[], token: string, parallel: number, stop: () => boolean): Promise<number> {
  let ok = 0;
  let turn = 0;
  await Promise.all(
    Array.from({ length: parallel }, async () => {
      while (!stop()) {
        const all = targets();
        const base = all[turn++ % all.length] as string;
        const s = await statusOf(base, token).catch(() => 0);
        if (s === 200) ok++;
        else if (s !== 429) await sleep(20);
      }
    }),
  );
  return ok;
}

/** An upstream that answers every request `ms` later: requests overlap. */
function slowUpstream(ms: number): ReturnType<typeof startUpstream> {
  return startUpstream(async (req, res) => {
    req.resume();
    await sleep(ms);
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end('{}');
  });
}

function via(url: string, proxy: TcpProxy): string {
  const u = new URL(url);
  u.port = String(proxy.port);
  return u.toString();
}

/**
 * Three gateways on one database, a quota of `quota`/day, each gateway's
 * database path through a proxy of its own; `fault` runs while traffic
 * flows; then traffic until every gateway refuses. The upstream must have
 * seen no more than the quota.
 */
async function fleetUnderFault(
  quota: number,
  fault: (f: { gateways: FleetGateway[]; proxies: TcpProxy[]; frozen: Set<number>; db: TestDatabase }) => Promise<void>,
): Promise<{ forwarded: number; granted: number }> {
  const db = await startDatabase();
  const up = await slowUpstream(40);
  const proxies = await Promise.all([0, 1, 2].map(() => startTcpProxy(Number(new URL(db.url).port))));
  const gateways: FleetGateway[] = [];
  try {
    const direct = { KEYWARD_DATABASE_URL: db.url };
    assert.equal((await runCli(['db', 'migrate'], direct)).code, 0);
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'faulty', '--quota', `${quota}/day`, '--json'], direct)).stdout) as {
      id: string;
      token: string;
    };
    for (const p of proxies) {
      gateways.push(
        await startFleetGateway({
          KEYWARD_DATABASE_URL: via(db.url, p),
          KEYWARD_DATABASE_TIMEOUT: '1s',
          KEYWARD_LEASE_TTL: '2s',
          KEYWARD_USAGE_FLUSH: '200ms',
          KEYWARD_SEO_URL: up.url,
          KEYWARD_SEO_LOGIN: 'l',
          KEYWARD_SEO_PASSWORD: 'p',
          KEYWARD_ADMIN_PORT: 'off',
        }),
      );
    }
    const frozen = new Set<number>();
    const targets = (): string[] => gateways.filter((_, i) => !frozen.has(i)).map((g) => g.base);
    let faulting = true;
    const during = traffic(targets, key.token, 6, () => !faulting);
    try {
      await sleep(300);
      await fault({ gateways, proxies, frozen, db });
    } finally {
      // Whatever the fault did (an assertion in it may have failed), the traffic ends.
      faulting = false;
      await during;
    }
    // Then until every gateway refuses: what was left, and nothing more.
    for (let round = 0; round < 40; round++) {
      const codes = await Promise.all(gateways.map((g) => statusOf(g.base, key.token)));
      if (codes.every((c) => c === 429)) break;
      await sleep(100);
    }
    await sleep(500);
    const [row] = await db.admin<Array<{ granted: number }>>`select granted from keyward_allowances where key_id = ${key.id} and kind = 'quota'`;
    return { forwarded: up.requests.length, granted: row?.granted ?? 0 };
  } catch (e) {
    // What each gateway said (it never logs a secret), to read why.
    for (const [i, g] of gateways.entries()) console.log(`gateway ${i}'s output:\n${g.output()}\nand stderr:\n${g.errors()}`);
    throw e;
  } finally {
    for (const g of gateways) await g.stop().catch(() => g.kill());
    for (const p of proxies) await p.close();
    await up.close();
    await db.close();
  }
}

test('the database path of every gateway frozen past the lease TTL: no unit granted twice', { timeout: 120_000 }, async () => {
  const quota = 60;
  const r = await fleetUnderFault(quota, async ({ proxies }) => {
    for (const p of proxies) p.freeze();
    await sleep(5_000); // TTL 2 s: every lease expires meanwhile, by the database's clock
    for (const p of proxies) p.heal();
    await sleep(2_000);
  });
  assert.ok(r.forwarded <= quota, `${r.forwarded} forwarded for a quota of ${quota}`);
  assert.ok(r.granted <= quota, `granted ${r.granted}`);
  console.log(`every database path frozen 5 s (lease TTL 2 s): ${r.forwarded} forwarded for a quota of ${quota}`);
});

test('one gateway frozen (SIGSTOP) past the lease TTL with requests admitted, then thawed: no unit granted twice', { timeout: 120_000 }, async () => {
  const quota = 50;
  const r = await fleetUnderFault(quota, async ({ gateways, frozen, db }) => {
    const g = gateways[2] as FleetGateway;
    // It holds a lease when it stops (a loaded machine may take a while to route it a request).
    await eventually(
      async () => (await db.admin<Array<{ n: number }>>`select count(*)::int as n from keyward_leases where gateway like ${`${g.pid}-%`}`)[0]?.n !== 0,
      20_000,
      'the gateway to be frozen holds a lease',
    );
    // Requests in flight when it stops; the others keep going.
    const held = Promise.all(Array.from({ length: 3 }, () => statusOf(g.base, 'unused').catch(() => 0)));
    frozen.add(2);
    process.kill(g.pid, 'SIGSTOP');
    await sleep(5_000);
    process.kill(g.pid, 'SIGCONT');
    frozen.delete(2);
    await held;
    // Its first renewal after the thaw finds them swept (log lines are written in batches: waited for, with a deadline).
    await eventually(() => /leases found swept at renewal/.test(g.output()), 15_000, 'the thawed gateway to learn that its leases were swept').catch(
      (e: unknown) => {
        console.log(`the thawed gateway's output:\n${g.output()}`);
        throw e;
      },
    );
  });
  assert.ok(r.forwarded <= quota, `${r.forwarded} forwarded for a quota of ${quota}`);
  console.log(`one gateway frozen 5 s (lease TTL 2 s): ${r.forwarded} forwarded for a quota of ${quota}`);
});

test("one gateway's database path silently cut past the lease TTL, the others healthy: no unit granted twice", { timeout: 120_000 }, async () => {
  const quota = 120;
  const r = await fleetUnderFault(quota, async ({ proxies }) => {
    (proxies[1] as TcpProxy).freeze();
    await sleep(5_000);
    (proxies[1] as TcpProxy).heal();
    await sleep(2_000);
  });
  assert.ok(r.forwarded <= quota, `${r.forwarded} forwarded for a quota of ${quota}`);
  console.log(`one database path cut 5 s (lease TTL 2 s): ${r.forwarded} forwarded for a quota of ${quota}`);
});

test(
  'one gateway, no database: killed (SIGKILL) with requests in flight and restarted, it never grants the spent quota again',
  { timeout: 120_000 },
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'keyward-kill-'));
    const up = await slowUpstream(700);
    const env = {
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
      KEYWARD_ADMIN_PORT: 'off',
      KEYWARD_LEASE_TTL: '2s',
    };
    try {
      const key = JSON.parse((await runCli(['keys', 'create', '--name', 'crashy', '--quota', '30/day', '--json'], env)).stdout) as { token: string };
      const first = await startFleetGateway(env);
      const burst = (g: FleetGateway): Promise<number[]> => Promise.all(Array.from({ length: 40 }, () => statusOf(g.base, key.token).catch(() => 0)));
      const inFlight = burst(first);
      await sleep(1_000);
      first.kill();
      await inFlight;
      const second = await startFleetGateway(env);
      try {
        const codes = await burst(second);
        await eventually(() => up.requests.length >= 0, 1_000, 'settled');
        await sleep(800);
        assert.ok(up.requests.length <= 30, `${up.requests.length} reached the upstream for a quota of 30/day (the killed gateway's admissions granted again)`);
        assert.ok(codes.includes(429), 'the restarted gateway refuses what the killed one had taken');
        console.log(`kill -9 with 40 in flight, restart, 40 more: ${up.requests.length} forwarded for a quota of 30`);
      } finally {
        await second.stop().catch(() => second.kill());
      }
    } finally {
      await up.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test('KEYWARD_WORKERS=2, one worker killed (SIGKILL) with requests in flight, then the whole machine: the quota holds', { timeout: 120_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-kill-worker-'));
  const up = await slowUpstream(700);
  const env = {
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_WORKERS: '2',
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_ADMIN_PORT: 'off',
    KEYWARD_LEASE_TTL: '2s',
  };
  try {
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'worky', '--quota', '30/day', '--json'], env)).stdout) as { token: string };
    const g = await startFleetGateway(env);
    try {
      const workers = execFileSync('pgrep', ['-P', String(g.pid)])
        .toString()
        .trim()
        .split('\n')
        .map(Number);
      assert.ok(workers.length >= 2, `two workers (${workers.join(', ')})`);
      const burst = (n: number, base = g.base): Promise<number[]> => Promise.all(Array.from({ length: n }, () => statusOf(base, key.token).catch(() => 0)));
      // 20 admitted and in flight; one worker killed, then (before any flush) the whole machine.
      const inFlight = burst(20);
      await sleep(300);
      process.kill(workers[0] as number, 'SIGKILL');
      await sleep(200);
      for (const pid of [g.pid, ...workers.slice(1)]) process.kill(pid, 'SIGKILL');
      await inFlight;
      await sleep(800); // the requests in flight end at the upstream
      const again = await startFleetGateway(env);
      try {
        await burst(40, again.base);
        await sleep(800);
      } finally {
        await again.stop().catch(() => again.kill());
      }
      assert.ok(up.requests.length <= 30, `${up.requests.length} reached the upstream for a quota of 30/day`);
      console.log(
        `workers=2: a worker killed with requests in flight, then the whole machine, restarted, 40 more: ${up.requests.length} forwarded for a quota of 30`,
      );
    } finally {
      await g.stop().catch(() => g.kill());
    }
  } finally {
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
