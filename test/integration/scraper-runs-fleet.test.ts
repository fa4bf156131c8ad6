// Scraper runs across a fleet (docs/limits.md, "Scraper runs"): three
// gateways as real processes on one real PostgreSQL, and with workers. Each
// run is asked about by one gateway at a time and booked once; a scraper
// budget refuses at the right run with each admitted run capped.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { withFleet, type Fleet, type FleetGateway } from '../support/fleet.ts';
import { startPlatform, type Platform } from '../support/platform.ts';

const TOKEN = 'apify_api_fleetrunsmaster0123456789';

const start = (g: FleetGateway, token: string, actor: string): Promise<{ status: number; json: () => unknown }> =>
  request(`${g.base}/scraper/v2/acts/${actor}/runs?build=latest`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: '{}',
  });

/** The scraper's booked cost and requests in the shared ledger, and the runs still pending. */
async function booked(f: Fleet): Promise<{ cost: number; requests: number; pending: number }> {
  const [u] = await f.db.admin<
    Array<{ cost: number; requests: number }>
  >`select coalesce(sum(cost), 0)::float8 as cost, coalesce(sum(requests), 0)::int as requests from keyward_usage where route = 'scraper'`;
  const [r] = await f.db.admin<Array<{ n: number }>>`select count(*)::int as n from keyward_runs`;
  return { cost: Math.round((u?.cost ?? 0) * 1e6) / 1e6, requests: u?.requests ?? 0, pending: r?.n ?? 0 };
}

async function withPlatform(run: (f: Fleet, p: Platform) => Promise<void>): Promise<void> {
  const p = await startPlatform();
  try {
    await withFleet((f) => run(f, p), {
      env: { KEYWARD_SCRAPER_URL: p.up.url, KEYWARD_SCRAPER_TOKEN: TOKEN, KEYWARD_USAGE_FLUSH: '200ms', KEYWARD_ADMIN_PORT: 'off' },
    });
  } finally {
    await p.close();
  }
}

test('three gateways on one PostgreSQL: 30 runs started across them are each asked about once and booked once, exactly', async () => {
  await withPlatform(async (f, p) => {
    const key = await f.key('runner');
    const gws = await Promise.all([f.gateway(), f.gateway(), f.gateway()]);
    const prices = ['0.10', '0.25', '0.40'];
    const started = await Promise.all(Array.from({ length: 30 }, (_, i) => start(gws[i % 3] as FleetGateway, key.token, `quick-${prices[i % 3] ?? '0.10'}`)));
    assert.deepEqual(
      started.map((r) => r.status),
      Array(30).fill(201),
    );
    await eventually(async () => (await booked(f)).pending === 0 && (await booked(f)).requests === 30, 30_000, 'every run booked');
    // 10 × (0.10 + 0.25 + 0.40)
    assert.deepEqual(await booked(f), { cost: 7.5, requests: 30, pending: 0 });
    assert.equal(p.runs.size, 30);
    for (const run of p.runs.values()) assert.equal(run.asked, 1, `run of ${run.actor} asked once`);
    // One "settled" line per run across the three (log lines are written in batches: waited for).
    const settled = (): number[] =>
      gws.map(
        (g) =>
          g
            .output()
            .split('\n')
            .filter((l) => l.includes('"msg":"scraper run settled"')).length,
      );
    await eventually(() => settled().reduce((a, b) => a + b, 0) >= 30, 10_000, 'thirty settled lines');
    assert.equal(
      settled().reduce((a, b) => a + b, 0),
      30,
      `settled per gateway: ${settled().join(', ')}`,
    );
    for (const g of gws) assert.equal(g.output().includes(TOKEN), false, 'the master credential is in no log line');
    assert.equal(p.up.raw().includes(key.token), false, 'the client token never reached the platform');
  });
});

test('a scraper budget across three gateways (one with workers): each run capped at its run cap or what is left, the ledger never above the budget, the fifth refused', async () => {
  await withPlatform(async (f, p) => {
    const key = await f.key('budgeted', '--budget', 'scraper=1/day', '--run-cap', '0.5');
    const gws = [await f.gateway(), await f.gateway({ KEYWARD_WORKERS: '2' }), await f.gateway()];
    // The ledger is read all along: runs in flight are booked at their caps, so it never shows more than the budget.
    let highest = 0;
    let watching = true;
    const watch = (async () => {
      while (watching) {
        try {
          highest = Math.max(highest, (await booked(f)).cost);
        } catch (err) {
          // The database is closed when the test ends early: the test's own error is the one to report.
          if (watching) throw err;
        }
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    })();
    try {
      for (let i = 0; i < 4; i++) {
        // A gateway may refuse while another still holds an unused part of what is left (docs/limits.md, "Quotas and
        // budgets: leases, exact"): the run is asked of the others then, as a client would, for up to 10 s.
        let r = await start(gws[i % 3] as FleetGateway, key.token, 'quick-0.30');
        for (let k = 1, until = Date.now() + 10_000; r.status === 429 && Date.now() < until; k++) {
          await new Promise((resolve) => setTimeout(resolve, 100));
          r = await start(gws[(i + k) % 3] as FleetGateway, key.token, 'quick-0.30');
        }
        assert.equal(r.status, 201, `run ${i + 1}: ${JSON.stringify(r.json())}`);
        await eventually(async () => (await booked(f)).pending === 0 && (await booked(f)).requests === i + 1, 30_000, `run ${i + 1} booked`);
      }
    } finally {
      watching = false;
      await watch;
    }
    const runs = [...p.runs.values()];
    for (const r of runs) assert.match(r.query, /^\?build=latest&maxTotalChargeUsd=\d+(?:\.\d+)?$/, 'the query kept, the cap appended');
    const caps = runs.map((r) => Number(new URLSearchParams(r.query).get('maxTotalChargeUsd')));
    // Each cap is the key's run cap or what the gateway's lease holds of what is left, whichever is less: never more
    // than either. (On a quiet machine [0.5, 0.5, 0.4, 0.1]; under load a lease may hold part of what is left, and a
    // run is capped lower: [0.5, 0.5, 0.2, 0.2].)
    let left = 1;
    for (const [i, cap] of caps.entries()) {
      assert.ok(cap > 0 && cap <= 0.5 && cap <= left + 1e-9, `run ${i + 1} capped at ${cap} with ${left} left: ${caps.join(', ')}`);
      left = Math.round((left - Math.min(cap, 0.3)) * 1e6) / 1e6;
    }
    const spent = runs.reduce((a, r) => a + r.cost, 0);
    assert.equal(Math.round(spent * 1e6) / 1e6, 1);
    assert.equal((await booked(f)).cost, 1, 'each run booked once at what the platform charged');
    assert.ok(highest <= 1 + 1e-9, `the ledger showed ${highest} of a 1 USD budget`);
    for (const [i, g] of gws.entries()) {
      const refused = await start(g, key.token, 'quick-0.30');
      assert.equal(refused.status, 429, `gateway ${i + 1} of 3 started a fifth run: ${JSON.stringify(refused.json())} (${p.runs.size} runs at the platform)`);
      assert.equal((refused.json() as { code: string }).code, 'budget_exceeded');
    }
    assert.equal(p.runs.size, 4, 'no refused run reached the platform');
  });
});
