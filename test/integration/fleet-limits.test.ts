// Limits across a fleet (docs/limits.md): three gateways on one PostgreSQL
// share a key's quota, rate and concurrency; the ledger's totals equal what
// they forwarded; a gateway that leaves gives its share back.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from '../support/client.ts';
import { runCli, startCli } from '../support/cli.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';

const FLUSH_MS = 500;

test(
  'three gateways share quota, rate and concurrency within the stated overshoot; the ledger equals what was forwarded; a gateway leaving gives its share back',
  { timeout: 180_000 },
  async () => {
    const db = await startDatabase();
    const held: http.ServerResponse[] = [];
    const up = await startUpstream((req, res) => {
      req.resume();
      if (req.url?.startsWith('/v1/') === true) {
        res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': '10', 'content-length': 2 });
        return void res.end('ok');
      }
      if (req.url?.includes('hold') === true) {
        res.writeHead(200, { 'content-type': 'text/plain' });
        res.write('held');
        held.push(res);
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': 2 });
      res.end('{}');
    });
    const env = {
      KEYWARD_DATABASE_URL: db.url,
      KEYWARD_PORT: '0',
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
      KEYWARD_SPEECH_URL: up.url,
      KEYWARD_SPEECH_KEY: 'speech-secret-value',
      KEYWARD_USAGE_FLUSH: `${FLUSH_MS}ms`,
    };
    const gateways: Array<Awaited<ReturnType<typeof startCli>>> = [];
    try {
      const key = async (name: string, ...limits: string[]): Promise<string> => {
        const r = await runCli(['keys', 'create', '--name', name, ...limits, '--json'], env);
        assert.equal(r.code, 0, r.stderr);
        return (JSON.parse(r.stdout) as { token: string }).token;
      };
      const quota = await key('quota', '--quota', '60/day');
      const rate = await key('rate', '--rate', '6/m', '--burst', '6');
      const conc = await key('conc', '--concurrency', '3');
      const budget = await key('budget', '--budget', 'speech=200/day');
      for (let i = 0; i < 3; i++) gateways.push(await startCli(['serve'], env, '"msg":"keyward listening"'));
      const bases = gateways.map(
        (g) =>
          `http://127.0.0.1:${
            (
              JSON.parse(
                g
                  .output()
                  .split('\n')
                  .find((l) => l.includes('keyward listening')) as string,
              ) as { port: number }
            ).port
          }`,
      );
      const get = async (base: string, token: string, path = '/seo/v3/x'): Promise<number> =>
        (await request(`${base}${path}`, { headers: { authorization: `Bearer ${token}` } })).status;
      // Each gateway has seen the others' heartbeats.
      await sleep(FLUSH_MS * 3);

      // Quota: three clients, one per gateway, 20 requests a second each, until every one is refused.
      const admitted = [0, 0, 0];
      await Promise.all(
        bases.map(async (base, g) => {
          for (let i = 0; i < 60; i++) {
            if ((await get(base, quota)) === 200) admitted[g] = (admitted[g] as number) + 1;
            await sleep(50);
          }
        }),
      );
      const total = admitted.reduce((a, b) => a + b, 0);
      // Leases (docs/limits.md): the fleet never admits more than the quota, and every gateway had
      // more requests than its part, so no unit was left unused either.
      console.log(`quota 60/day on 3 gateways: admitted ${total} (${admitted.join(' + ')}); overshoot ${total - 60}`);
      assert.equal(total, 60, `admitted ${total}`);

      // Budget 200 characters a day, each call reporting 10: the same mechanism, in the route's unit.
      const spentBy = [0, 0, 0];
      await Promise.all(
        bases.map(async (base, g) => {
          for (let i = 0; i < 30; i++) {
            if ((await get(base, budget, '/speech/v1/tts')) === 200) spentBy[g] = (spentBy[g] as number) + 10;
            await sleep(50);
          }
        }),
      );
      const spent = spentBy.reduce((a, b) => a + b, 0);
      // Worst case (docs/limits.md): the gap between estimate and cost of the calls in flight. One at a
      // time per gateway, and a gateway's first call estimated at 0 until it learnt the cost: 3 × 10.
      const budgetBound = 200 + 3 * 10;
      console.log(
        `budget speech=200/day on 3 gateways: ${spent} characters admitted (${spentBy.join(' + ')}); overshoot ${spent - 200}, bound ${budgetBound - 200}`,
      );
      assert.ok(spent >= 200 && spent <= budgetBound, `spent ${spent}`);

      // Rate 6/m burst 6: each gateway takes a third, so a burst at all three passes 6 in all.
      const burst = await Promise.all(
        bases.map(async (base) => (await Promise.all(Array.from({ length: 5 }, () => get(base, rate)))).filter((s) => s === 200).length),
      );
      const burstTotal = burst.reduce((a, b) => a + b, 0);
      console.log(`rate 6/m burst 6 on 3 gateways: a burst of 15 admitted ${burstTotal} (${burst.join(' + ')})`);
      assert.ok(burstTotal >= 6 && burstTotal <= 6 + 2, `burst admitted ${burstTotal}`);

      // Concurrency 3: one slot a gateway.
      const holds: http.ClientRequest[] = [];
      const hold = (base: string): Promise<number> =>
        new Promise((resolve) => {
          const req = http.get(`${base}/seo/v3/hold`, { headers: { authorization: `Bearer ${conc}` }, agent: false }, (res) => {
            resolve(res.statusCode as number);
            if (res.statusCode !== 200) res.resume();
          });
          req.on('error', () => resolve(0));
          holds.push(req);
        });
      const first = await Promise.all(bases.map((b) => hold(b)));
      const second = await Promise.all(bases.map((b) => hold(b)));
      console.log(`concurrency 3 on 3 gateways: ${first.filter((s) => s === 200).length + second.filter((s) => s === 200).length} in flight of 6 tried`);
      assert.deepEqual(first, [200, 200, 200]);
      assert.deepEqual(second, [429, 429, 429]);

      // A gateway leaves: the two left take its share (ceil(3/2) = 2 slots each) within a few flushes.
      const leaving = gateways.pop() as Awaited<ReturnType<typeof startCli>>;
      for (const r of held) r.end(); // lets the leaving gateway drain at once
      held.length = 0;
      for (const r of holds) r.destroy();
      leaving.child.kill('SIGTERM');
      await deadline(leaving.done, 20_000, 'left');
      const a = await hold(bases[0] as string);
      // Within a few flushes when idle; a loaded machine gets room (the figure is printed, bench/ measures).
      const leftAt = performance.now();
      await eventually(async () => (await hold(bases[0] as string)) === 200, 20_000, 'the share of the gateway that left taken over');
      console.log(`the share of a gateway that left was taken over ${(performance.now() - leftAt).toFixed(0)} ms after it exited`);
      assert.equal(a, 200);
      for (const r of held) r.end();
      for (const r of holds) r.destroy();

      // The ledger equals what the gateways forwarded, exactly (after the drains).
      for (const g of gateways) {
        g.child.kill('SIGTERM');
        await deadline(g.done, 20_000, 'exit');
      }
      gateways.length = 0;
      const rows = JSON.parse((await runCli(['usage', '--json', '--key', 'quota'], env)).stdout) as Array<{ requests: number; limited: number }>;
      const forwarded = up.requests.filter((r) => r.headers.authorization !== undefined && r.url === '/v3/x').length;
      const ledger = JSON.parse((await runCli(['usage', '--json'], env)).stdout) as Array<{ requests: number }>;
      assert.equal(
        rows.reduce((s, r) => s + r.requests, 0),
        total,
        'quota key: ledger = admitted',
      );
      assert.equal(
        ledger.reduce((s, r) => s + r.requests, 0),
        up.requests.length,
        `every forwarded request in the ledger once (${forwarded} plain)`,
      );
    } finally {
      for (const r of held) r.destroy();
      for (const g of gateways) {
        g.child.kill('SIGTERM');
        await deadline(g.done, 20_000, 'exit').catch(() => undefined);
      }
      await up.close();
      await db.close();
    }
  },
);
