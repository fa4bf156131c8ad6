// Budgets and quotas across a fleet on a real PostgreSQL, attacked as in
// issue #50's tables: two gateways and another key's failing POSTs first
// admitted 24 of 40 runs for 7.0 USD of a 1 USD budget; with the database
// frozen a spent key waited ~5 s for its 429 and a fresh key with a quota as
// long, the usage page hung 30 s and more, and `/usage?key=nosuch` sent a
// NUL byte to PostgreSQL (503). Now caps come out of what each gateway's
// lease holds, a decision that needs the store waits KEYWARD_ADMISSION_WAIT
// at most, and the usage page answers within a stated time
// (docs/limits.md, "Scraper runs", "Admission under a store that does not
// answer", "The usage page").
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request, type Reply } from '../support/client.ts';
import { startTcpProxy } from '../support/tcp-proxy.ts';
import { withFleet, type FleetGateway } from '../support/fleet.ts';
import { startPlatform } from '../support/platform.ts';

const TOKEN = 'apify_api_fleetattackmaster0123456789';

const post = (g: FleetGateway, token: string, path: string): Promise<Reply> =>
  request(`${g.base}/scraper${path}`, { method: 'POST', headers: { authorization: `Bearer ${token}` }, body: '{}', timeoutMs: 30_000 });

test(
  'three gateways on PostgreSQL (one with two workers), another key fails 30 POSTs first, then 40 run-starts, sync runs and resurrects at once across them: the caps add up to the budget at most',
  { timeout: 180_000 },
  async () => {
    const p = await startPlatform();
    try {
      await withFleet(
        async (f) => {
          const key = await f.key('budgeted', '--budget', 'scraper=1/day');
          const noisy = await f.key('noisy', '--budget', 'scraper=100/day');
          const gws = [await f.gateway(), await f.gateway({ KEYWARD_WORKERS: '2' }), await f.gateway()];
          for (let i = 0; i < 30; i++) assert.equal((await post(gws[i % 3] as FleetGateway, noisy.token, '/v2/acts/x/no-such-endpoint')).status, 404);
          // A run of another key's to set going again.
          const other = await post(gws[0] as FleetGateway, noisy.token, '/v2/acts/never/runs');
          const id = (other.json() as { data: { id: string } }).data.id;
          const paths = [
            '/v2/acts/pay-0.30/runs?maxTotalChargeUsd=0.3',
            '/v2/acts/pay-0.30/run-sync-get-dataset-items',
            `/v2/actor-runs/${id}/resurrect?maxTotalChargeUsd=99999`,
          ];
          const before = p.runs.size;
          const replies = await Promise.all(Array.from({ length: 40 }, (_, i) => post(gws[i % 3] as FleetGateway, key.token, paths[i % 3] as string)));
          const statuses = replies.map((r) => (r.status === 201 || r.status === 200 ? 'ok' : `${r.status} ${(r.json() as { code: string }).code}`));
          const caps = [...p.runs.values()].slice(before).map((r) => r.cap);
          assert.equal(caps.length, statuses.filter((s) => s === 'ok').length, 'refused starts never reached the platform');
          const total = Math.round(caps.reduce((a, b) => a + b, 0) * 1e6) / 1e6;
          assert.ok(total <= 1, `caps ${caps.join(', ')} add up to ${total}`);
          assert.ok(caps.length >= 1, statuses.join(', '));
          for (const s of statuses.filter((x) => x !== 'ok')) assert.ok(s === '429 budget_exceeded' || s === '503 ledger_unavailable', String(s));
        },
        { env: { KEYWARD_SCRAPER_URL: p.up.url, KEYWARD_SCRAPER_TOKEN: TOKEN, KEYWARD_USAGE_FLUSH: '200ms' } },
      );
    } finally {
      await p.close();
    }
  },
);

test(
  'the database frozen: a spent limit refuses at once, a fresh quota gets 503 within the admission wait, the usage page 503 within its stated time; /usage?key=nosuch works',
  { timeout: 180_000 },
  async () => {
    await withFleet(async (f) => {
      const proxy = await startTcpProxy(Number(new URL(f.db.url).port));
      try {
        const via = new URL(f.db.url);
        via.port = String(proxy.port);
        const spent = await f.key('spent', '--quota', '2/day');
        const fresh = await f.key('fresh', '--quota', '50/day');
        const free = await f.key('free');
        const g = await f.gateway({ KEYWARD_DATABASE_URL: via.toString(), KEYWARD_DATABASE_TIMEOUT: '5s', KEYWARD_ADMISSION_WAIT: '250ms' });
        const call = async (token: string): Promise<{ status: number; ms: number }> => {
          const at = performance.now();
          const r = await request(`${g.base}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` }, timeoutMs: 30_000 });
          return { status: r.status, ms: performance.now() - at };
        };
        assert.equal((await call(spent.token)).status, 200);
        assert.equal((await call(spent.token)).status, 200);
        assert.equal((await call(spent.token)).status, 429);
        // The usage page's filters on PostgreSQL: a key nobody has is an empty page, not an error.
        assert.equal((await request(`${g.admin as string}/usage?key=nosuch`)).status, 200);
        assert.equal((await request(`${g.admin as string}/usage?key=spent&route=seo`)).status, 200);
        proxy.freeze();
        const refused = await call(spent.token);
        assert.equal(refused.status, 429, 'a spent quota is refused from memory');
        assert.ok(refused.ms < 1_000, `refused in ${refused.ms.toFixed(0)} ms`);
        const waited = await call(fresh.token);
        assert.equal(waited.status, 503);
        assert.ok(waited.ms < 2_000, `a fresh quota answered in ${waited.ms.toFixed(0)} ms (admission wait 250 ms)`);
        const again = await call(fresh.token);
        assert.equal(again.status, 503);
        assert.ok(again.ms < 2_000, `${again.ms.toFixed(0)} ms`);
        const unlimited = await call(free.token);
        assert.equal(unlimited.status, 200, 'a key without limits is never slowed');
        const at = performance.now();
        const page = await request(`${g.admin as string}/usage?route=seo`, { timeoutMs: 30_000 });
        const pageMs = performance.now() - at;
        assert.equal(page.status, 503);
        assert.equal((page.json() as { code: string }).code, 'usage_unavailable');
        assert.ok(pageMs < 15_000, `the usage page answered in ${pageMs.toFixed(0)} ms`);
        proxy.heal();
      } finally {
        proxy.heal();
        await proxy.close();
      }
    });
  },
);
