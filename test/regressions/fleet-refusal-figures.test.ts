// In a fleet, refusals spoke of one gateway: a concurrency of 3 over three
// gateways refused 147 of 150 overlapping requests saying `used: 1` with
// `RateLimit-Remaining: 0`, and a quota refused by the leases said what it
// would have said alone. A refusal now gives the key's figures
// (docs/limits.md, "Refusals"), as GET /keyward/key does.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from '../support/client.ts';
import { runCli } from '../support/cli.ts';
import { startFleetGateway, type FleetGateway } from '../support/fleet.ts';
import { startDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';

test(
  "a fleet's refusals give the key's figures: concurrency all in use, a quota at least spent and as the key's status says",
  { timeout: 120_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream(async (req, res) => {
      req.resume();
      await sleep(req.url?.includes('slow') === true ? 800 : 5);
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{}');
    });
    const env = {
      KEYWARD_DATABASE_URL: db.url,
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
      KEYWARD_USAGE_FLUSH: '200ms',
      KEYWARD_ADMIN_PORT: 'off',
    };
    const gateways: FleetGateway[] = [];
    try {
      assert.equal((await runCli(['db', 'migrate'], env)).code, 0);
      const conc = JSON.parse((await runCli(['keys', 'create', '--name', 'conc', '--concurrency', '3', '--json'], env)).stdout) as { token: string };
      const quota = JSON.parse((await runCli(['keys', 'create', '--name', 'quota', '--quota', '12/day', '--json'], env)).stdout) as { token: string };
      for (let i = 0; i < 3; i++) gateways.push(await startFleetGateway(env));
      await sleep(1_000); // heartbeats: each gateway sees three
      type Refusal = { status: number; code?: string; used?: number; remaining: string | undefined };
      const call = async (g: FleetGateway, token: string, path: string): Promise<Refusal> => {
        const r = await request(`${g.base}${path}`, { headers: { authorization: `Bearer ${token}` } });
        const body = r.status === 429 ? (r.json() as { code: string; limit: { used: number } }) : null;
        return { status: r.status, code: body?.code, used: body?.limit.used, remaining: r.headers['ratelimit-remaining'] as string | undefined };
      };
      const all = await Promise.all(Array.from({ length: 30 }, (_, i) => call(gateways[i % 3] as FleetGateway, conc.token, '/seo/v3/slow')));
      const refused = all.filter((r) => r.status === 429);
      assert.ok(all.filter((r) => r.status === 200).length <= 3, 'at most the concurrency at once');
      assert.ok(refused.length >= 27);
      for (const r of refused) {
        assert.equal(r.code, 'concurrency_limited');
        assert.equal(r.used, 3, "the key's concurrency is all in use, as Remaining 0 says");
        assert.equal(r.remaining, '0');
      }

      // The quota spent across the fleet; a refusal then says at least the quota, and what the key's status says.
      for (let i = 0; i < 12; i++) assert.equal((await call(gateways[i % 3] as FleetGateway, quota.token, '/seo/v3/x')).status, 200);
      await sleep(600); // written by every gateway
      const statusOf = async (g: FleetGateway): Promise<number> =>
        (
          (await request(`${g.base}/keyward/key`, { headers: { authorization: `Bearer ${quota.token}` } })).json() as {
            limits: Array<{ kind: string; used: number }>;
          }
        ).limits.find((l) => l.kind === 'quota')?.used ?? -1;
      for (const g of gateways) {
        const said = await statusOf(g);
        const r = await call(g, quota.token, '/seo/v3/x');
        assert.equal(r.status, 429);
        assert.equal(r.code, 'quota_exceeded');
        assert.equal(said, 12, "the key's status: the fleet's 12");
        assert.equal(r.used, 12, 'the refusal: the same');
      }
    } finally {
      for (const g of gateways) await g.stop().catch(() => g.kill());
      await up.close();
      await db.close();
    }
  },
);
