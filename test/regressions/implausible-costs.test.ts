// A cost an upstream reports is believed only as a plain number a call can
// plausibly cost: `0x10` was counted as 16, `{"cost":1.7e308}` three times
// made the ledger's cost Infinity, and one `1e308` locked a budget for the
// period. Such values now count as none, said once per route, and the
// ledger never holds a number that is not finite (docs/limits.md).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';
import { MemoryUsageStore } from '../../src/ledger/memory-store.ts';

test('hexadecimal, exponent, infinite and implausible costs count as none; the ledger stays finite and a budget is not locked', async () => {
  const speechCosts = ['0x10', '1e308', 'Infinity', '2000000', ' 12 '];
  const seoBodies = ['{"cost":1.7e308}', '{"cost":1.7e308}', '{"cost":1.7e308}', '{"cost":5000}', '{"cost":0.25}'];
  let s = 0;
  let b = 0;
  const up = await startUpstream((req, res) => {
    req.resume();
    if (req.url?.startsWith('/v1/') === true) {
      res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': speechCosts[s++ % speechCosts.length] as string });
      return void res.end('mp3');
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(seoBodies[b++ % seoBodies.length]);
  });
  const store = new MemoryUsageStore();
  const gw = await startGateway({ speech: up.url, seo: up.url, usageStore: store, limits: { budgets: { seo: '1/day', speech: '100/day' } } });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    for (let i = 0; i < speechCosts.length; i++)
      assert.equal((await request(`${gw.url}/speech/v1/tts`, { method: 'POST', headers: auth, body: '{}' })).status, 200, `speech ${i}`);
    for (let i = 0; i < seoBodies.length; i++)
      assert.equal((await request(`${gw.url}/seo/v3/x${i}`, { headers: auth })).status, 200, `seo ${i}: a budget of 1 is not locked by a reported 1.7e308`);
    await gw.gateway.shutdown();
    const rows = await store.rows({});
    const cost = (route: string): number => rows.filter((r) => r.route === route).reduce((n, r) => n + r.cost, 0);
    assert.equal(cost('speech'), 12, 'only the plain, plausible "12" counted');
    assert.equal(cost('seo'), 0.25);
    assert.ok(rows.every((r) => Number.isFinite(r.cost)));
    const said = gw.logs().filter((l) => String(l.msg).includes('reported a cost that is not a number'));
    assert.deepEqual(said.map((l) => l.route).sort(), ['seo', 'speech'], 'said once per route');
  } finally {
    await gw.close();
    await up.close();
  }
});
