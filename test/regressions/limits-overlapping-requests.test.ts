// Overlapping requests passed every quota and budget: a request was counted
// only when it completed, so twelve at once on a `3/day` quota were all
// forwarded. Quotas and budgets are now reserved at admission and settled at
// completion (docs/limits.md, "Reserved at admission"); a request that never
// reached the upstream gives back what it took.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';
import { MemoryUsageStore } from '../../src/ledger/memory-store.ts';
import type { UsageRow } from '../../src/ledger/store.ts';

const auth = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` });
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

function slowUpstream(ms: number, body = '{"ok":true}', headers: Record<string, string> = {}) {
  return startUpstream(async (req, res) => {
    req.resume();
    await sleep(ms);
    res.writeHead(200, { 'content-type': 'application/json', ...headers });
    res.end(body);
  });
}

test('quota 3/day, 12 overlapping requests against a 400 ms upstream: exactly 3 forwarded, 9 refused; the ledger holds 3', async () => {
  const up = await slowUpstream(400);
  const store = new MemoryUsageStore();
  const gw = await startGateway({ seo: up.url, usageStore: store, limits: { quota: '3/day' } });
  try {
    const statuses = await Promise.all(
      Array.from({ length: 12 }, (_, i) => request(`${gw.url}/seo/v3/q${i}`, { headers: auth(gw.token) }).then((r) => r.status)),
    );
    assert.equal(statuses.filter((s) => s === 200).length, 3, statuses.join(','));
    assert.equal(statuses.filter((s) => s === 429).length, 9);
    assert.equal(up.requests.length, 3, 'the upstream saw three');
    // Later ones too, once the three are done.
    assert.equal((await request(`${gw.url}/seo/v3/after`, { headers: auth(gw.token) })).status, 429);
    await gw.gateway.shutdown();
    const rows = await store.rows({});
    assert.equal(
      rows.reduce((n, r) => n + r.requests, 0),
      3,
    );
    assert.equal(
      rows.reduce((n, r) => n + r.limited, 0),
      10,
    );
  } finally {
    await gw.close();
    await up.close();
  }
});

test('budget seo=0.05/day at 0.02 a call, 10 overlapping on a gateway that never saw the cost: at most ⌈B/c⌉ = 3 forwarded', async () => {
  const up = await slowUpstream(300, '{"status_code":20000,"cost":0.02,"tasks":[]}');
  const store = new MemoryUsageStore();
  const gw = await startGateway({ seo: up.url, usageStore: store, limits: { budgets: { seo: '0.05/day' } } });
  try {
    // The first call goes alone (nothing to reserve yet); the others wait for its cost, then reserve it.
    const statuses = await Promise.all(
      Array.from({ length: 10 }, (_, i) => request(`${gw.url}/seo/v3/b${i}`, { headers: auth(gw.token) }).then((r) => r.status)),
    );
    const forwarded = statuses.filter((s) => s === 200).length;
    assert.equal(forwarded, Math.ceil(0.05 / 0.02), statuses.join(','));
    assert.equal(up.requests.length, forwarded);
    const refused = await request(`${gw.url}/seo/v3/later`, { headers: auth(gw.token) });
    assert.equal((refused.json() as { code: string }).code, 'budget_exceeded');
    await gw.gateway.shutdown();
    const rows = (await store.rows({})).filter((r: UsageRow) => r.route === 'seo');
    assert.ok(Math.abs(rows.reduce((n, r) => n + r.cost, 0) - forwarded * 0.02) < 1e-9, 'the ledger holds the reported cost of what was forwarded');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('requests whose upstream connection was refused (502) give their quota unit back and are not counted', async () => {
  const up = await slowUpstream(0, 'ok');
  const store = new MemoryUsageStore();
  // seo points at a port nothing listens on; speech at a live upstream; the quota is the key's, over both.
  const gw = await startGateway({ speech: up.url, usageStore: store, limits: { quota: '3/day' } });
  try {
    const refusedConn = await Promise.all(Array.from({ length: 5 }, () => request(`${gw.url}/seo/v3/x`, { headers: auth(gw.token) }).then((r) => r.status)));
    assert.deepEqual(refusedConn, [502, 502, 502, 502, 502]);
    const served: number[] = [];
    for (let i = 0; i < 4; i++) served.push((await request(`${gw.url}/speech/v1/x`, { headers: auth(gw.token) })).status);
    assert.deepEqual(served, [200, 200, 200, 429], 'the quota is whole after five connection failures');
    await gw.gateway.shutdown();
    const rows = await store.rows({});
    assert.equal(
      rows.filter((r) => r.route === 'seo').reduce((n, r) => n + r.requests, 0),
      0,
      'never forwarded, never counted',
    );
    assert.equal(
      rows.filter((r) => r.route === 'speech').reduce((n, r) => n + r.requests, 0),
      3,
    );
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a concurrency limit and a quota together: the slot and the unit come back when the client leaves mid-response', async () => {
  let release: () => void = () => undefined;
  const held = new Promise<void>((r) => (release = r));
  const up = await startUpstream(async (req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'text/plain' });
    res.write('part');
    await held;
    res.end('rest');
  });
  const gw = await startGateway({ seo: up.url, usageStore: new MemoryUsageStore(), limits: { concurrency: 1, quota: '2/day' } });
  try {
    const controller = new AbortController();
    const first = fetch(`${gw.url}/seo/v3/long`, { headers: auth(gw.token), signal: controller.signal }).then(async (r) => {
      await r.body?.getReader().read();
      return r.status;
    });
    assert.equal(await first, 200);
    assert.equal((await request(`${gw.url}/seo/v3/second`, { headers: auth(gw.token) })).status, 429, 'one at a time');
    controller.abort();
    release();
    let next = 429;
    for (let i = 0; i < 50 && next === 429; i++) {
      await sleep(20);
      next = (await request(`${gw.url}/seo/v3/third`, { headers: auth(gw.token) })).status;
    }
    assert.equal(next, 200, 'the slot came back; the quota had one unit left (the first reached the upstream)');
    assert.equal((await request(`${gw.url}/seo/v3/fourth`, { headers: auth(gw.token) })).status, 429);
  } finally {
    release();
    await gw.close();
    await up.close();
  }
});
