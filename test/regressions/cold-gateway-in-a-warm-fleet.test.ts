// Each gateway of a fleet learnt a route's cost per call from its own first
// call, which it admitted at an estimate of nothing: three cold gateways
// overshot a budget by up to a call each (7 calls for a budget of 5). What a
// call costs is now shared through the store at every renewal
// (keyward_costs; docs/limits.md, "Across a fleet"): a gateway that has not
// seen the route reserves the fleet's figure.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { runCli } from '../support/cli.ts';
import { startFleetGateway, statusOf, type FleetGateway } from '../support/fleet.ts';
import { startDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';

test(
  "a cold gateway in a warm fleet reserves the fleet's cost per call: overlapping calls on two cold gateways stay within the budget",
  { timeout: 120_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream(async (req, res) => {
      req.resume();
      await sleep(300);
      res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': '10', 'content-length': 2 });
      res.end('ok');
    });
    const env = {
      KEYWARD_DATABASE_URL: db.url,
      KEYWARD_SPEECH_URL: up.url,
      KEYWARD_SPEECH_KEY: 'speech-secret-value',
      KEYWARD_USAGE_FLUSH: '200ms',
      KEYWARD_ADMIN_PORT: 'off',
    };
    const gateways: FleetGateway[] = [];
    try {
      assert.equal((await runCli(['db', 'migrate'], env)).code, 0);
      const warm = JSON.parse((await runCli(['keys', 'create', '--name', 'warm', '--json'], env)).stdout) as { token: string };
      const capped = JSON.parse((await runCli(['keys', 'create', '--name', 'capped', '--budget', 'speech=50/day', '--json'], env)).stdout) as { token: string };
      for (let i = 0; i < 3; i++) gateways.push(await startFleetGateway(env));
      const [a, b, c] = gateways as [FleetGateway, FleetGateway, FleetGateway];
      // The fleet learns the route's cost from one call on A, by a key with a budget of its own.
      const learner = JSON.parse((await runCli(['keys', 'create', '--name', 'learner', '--budget', 'speech=1000/day', '--json'], env)).stdout) as {
        token: string;
      };
      await sleep(1_500); // the new keys reach every gateway
      assert.equal(await statusOf(a.base, learner.token, '/speech/v1/tts'), 200);
      assert.equal(await statusOf(a.base, warm.token, '/speech/v1/tts'), 200);
      await sleep(1_000); // a few renewals: A writes the cost, B and C read it
      const before = up.requests.length;
      // B and C have never seen the route: ten overlapping calls on each.
      const codes = await Promise.all([b, c].flatMap((g) => Array.from({ length: 10 }, () => statusOf(g.base, capped.token, '/speech/v1/tts'))));
      const forwarded = up.requests.length - before;
      assert.equal(codes.filter((s) => s === 200).length, forwarded);
      assert.ok(forwarded <= 5, `${forwarded} calls at 10 characters forwarded for a budget of 50`);
      const [row] = await db.admin<Array<{ per_call: number }>>`select per_call from keyward_costs where route = 'speech'`;
      assert.equal(row?.per_call, 10);
      console.log(`two cold gateways in a warm fleet, 20 overlapping calls at 10 characters on a budget of 50: ${forwarded} forwarded`);
    } finally {
      for (const g of gateways) await g.stop().catch(() => g.kill());
      await up.close();
      await db.close();
    }
  },
);
