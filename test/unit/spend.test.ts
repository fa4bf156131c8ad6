// The pure parts of seeing spend: which thresholds a key crossed, the
// --alert-at flag, the stored alerts field, the webhook's give-up, the
// usage page's figures from a store's rows and its escaping.
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { describeLimits } from '../../src/cli/limits.ts';
import { applyLimits, limitChanges } from '../../src/keys/changes.ts';
import { UsageError } from '../../src/cli/args.ts';
import { crossed } from '../../src/alerts/alerts.ts';
import { MemoryAlertStore } from '../../src/ledger/memory-store.ts';
import { MemoryUsageStore } from '../../src/ledger/memory-store.ts';
import { renderPage } from '../../src/views/page.ts';
import { limitsProblem } from '../../src/keys/limits.ts';
import { policyOf } from '../../src/limits/policy.ts';
import { usagePage } from '../../src/views/report.ts';
import { signature, Webhook } from '../../src/alerts/webhook.ts';
import { eventually } from '../support/deadline.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';
import type { UsageRow } from '../../src/ledger/store.ts';
import { usageRow } from '../support/rows.ts';

const use = (requests: number, cost: Record<string, number>) => ({ requests: () => requests, cost: (_k: string, route: string) => cost[route] ?? 0 });
const key = { id: 'key_1', name: 'k' };

test('crossed: every threshold at or below the share used, in order, for the quota and each budget; none below the first', () => {
  const policy = policyOf({ quota: '10/day', budgets: { seo: '2/month' }, alerts: [100, 50, 80, 50] });
  assert.ok(policy !== null);
  assert.deepEqual(policy.alerts, [50, 80, 100]);
  const now = Date.UTC(2026, 10, 24, 12);
  assert.deepEqual(
    crossed(key, policy, use(4, { seo: 0.99 }), now, () => 'usd'),
    [],
  );
  const a = crossed(key, policy, use(8, { seo: 2 }), now, () => 'usd');
  assert.deepEqual(
    a.map((x) => [x.id, x.event]),
    [
      ['key_1/quota/2026-11-24/50', 'threshold_crossed'],
      ['key_1/quota/2026-11-24/80', 'threshold_crossed'],
      ['key_1/budget:seo/2026-11/50', 'threshold_crossed'],
      ['key_1/budget:seo/2026-11/80', 'threshold_crossed'],
      ['key_1/budget:seo/2026-11/100', 'limit_reached'],
    ],
  );
  assert.deepEqual(a[2]?.limit, {
    kind: 'budget',
    route: 'seo',
    value: 2,
    unit: 'usd',
    period: 'month',
    periodKey: '2026-11',
    threshold: 50,
    resetsAt: '2026-12-01T00:00:00Z',
  });
  // No quota or budget: no thresholds, whatever the record says; `[]` turns them off.
  assert.deepEqual(policyOf({ rate: '1/s', alerts: [80] })?.alerts, []);
  assert.deepEqual(policyOf({ quota: '1/day', alerts: [] })?.alerts, []);
  assert.deepEqual(policyOf({ quota: '1/day' })?.alerts, [80, 100]);
});

test('the stored alerts field: whole percentages 1 to 100, at most ten', () => {
  assert.equal(limitsProblem({ quota: '1/day', alerts: [80, 100] }, costRoutes(UPSTREAMS)), null);
  for (const bad of [[0], [101], [50.5], ['80'], 'all', Array(11).fill(5)])
    assert.match(limitsProblem({ alerts: bad }, costRoutes(UPSTREAMS)) ?? '', /\.limits\.alerts must be/, JSON.stringify(bad));
});

test('--alert-at: percentages with or without %, none, and every bad value reported', () => {
  assert.deepEqual(limitChanges({ 'alert-at': '100%,80%, 80' }, costRoutes(UPSTREAMS), 'help', false), { alerts: [80, 100] });
  assert.deepEqual(limitChanges({ 'alert-at': 'none' }, costRoutes(UPSTREAMS), 'help', false), { alerts: [] });
  for (const bad of ['0%', '101%', '80%,', 'half', '1,2,3,4,5,6,7,8,9,10,11'])
    assert.throws(() => limitChanges({ 'alert-at': bad }, costRoutes(UPSTREAMS), 'help', true), UsageError, bad);
  const limits = applyLimits({ quota: '5/day' }, { alerts: [50] });
  assert.deepEqual(limits, { quota: '5/day', alerts: [50] });
  assert.equal(describeLimits(limits), 'quota 5/day, alerts at 50%');
  assert.equal(describeLimits({ quota: '5/day', alerts: [] }), 'quota 5/day, no alerts');
});

test('a firing is recorded once per id; undelivered ones are handed to one sender at a time', async () => {
  const store = new MemoryAlertStore();
  const row = { id: 'a', keyId: 'k', body: '{}', at: Date.now() };
  assert.equal(await store.claimAlert(row), true);
  assert.equal(await store.claimAlert(row), false);
  assert.deepEqual(
    (await store.undeliveredAlerts('g1', 0, 60_000)).map((r) => r.id),
    ['a'],
  );
  assert.deepEqual(await store.undeliveredAlerts('g2', 0, 60_000), [], 'being sent by g1');
  await store.alertDelivered('a');
  assert.deepEqual(await store.undeliveredAlerts('g3', 0, 0), []);
});

test('the webhook gives an alert up once its retry window is over, and signs what it sends', async () => {
  const got: Array<{ body: string; sig: string | undefined }> = [];
  let status = 500;
  const server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      got.push({ body, sig: req.headers['x-keyward-signature'] as string | undefined });
      res.writeHead(status);
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const failed: Array<[string, boolean]> = [];
  const delivered: string[] = [];
  const hook = new Webhook({
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/`,
    secret: 's3cret',
    retryMs: 500,
    onDelivered: (id) => delivered.push(id),
    onFailed: (id, _reason, _attempt, gaveUp) => failed.push([id, gaveUp]),
  });
  try {
    hook.send('x', '{"n":1}', Date.now());
    hook.send('x', '{"n":1}', Date.now()); // the same id: queued once
    await eventually(() => failed.some(([, gaveUp]) => gaveUp), 10_000, 'given up');
    assert.equal(delivered.length, 0);
    assert.equal(got[0]?.sig, signature('s3cret', '{"n":1}'));
    assert.equal(signature('s3cret', '{"n":1}'), 'sha256=' + (await import('node:crypto')).createHmac('sha256', 's3cret').update('{"n":1}').digest('hex'));
    status = 204;
    hook.send('y', '{"n":2}', Date.now());
    await eventually(() => delivered.includes('y'), 10_000, 'delivered');
  } finally {
    hook.stop();
    server.close();
  }
});

test('the usage page from a store without its own aggregates: the same figures from its rows; names escaped', async () => {
  const store = new MemoryUsageStore();
  const day = new Date().toISOString().slice(0, 10);
  const row = (keyId: string, route: string, requests: number, cost: number): UsageRow => usageRow({ keyId, route, day, requests, cost });
  await store.add([row('key_a', 'seo', 7, 0.5), row('key_b', 'speech', 3, 95)], { gateway: 'g', seq: 1 });
  const records = [
    { id: 'key_a', name: '<b>a</b>', digest: '', created: '', expires: null, revoked: null },
    { id: 'key_b', name: 'b', digest: '', created: '', expires: null, revoked: null, limits: { budgets: { speech: '100/day' } } },
  ];
  const page = usagePage(
    store,
    () => records,
    ['seo', 'speech'],
    (r) => (r === 'seo' ? 'usd' : 'characters'),
    renderPage,
  );
  const html = await page(new URLSearchParams());
  assert.match(html, /data-day="[\d-]+" data-route="seo" data-requests="7"/);
  assert.match(html, /data-route="speech" data-cost="95"/);
  assert.ok(html.includes('&#60;b&#62;a&#60;/b&#62;') && !html.includes('<b>a</b>'), 'a name is text, never markup');
  assert.match(html, /budget speech 100\/day<\/td><td>95 of 100<\/td><td>95 %/);
  const one = await page(new URLSearchParams('key=b'));
  assert.ok(!one.includes('data-requests="7"') && one.includes('data-requests="3"'));
  const nowhere = await page(new URLSearchParams('key=b&route=nope'));
  assert.ok(nowhere.includes('no route named nope') && !nowhere.includes('data-requests='), 'a route that does not exist shows nothing, and says so');
  assert.match(await page(new URLSearchParams('key=nobody')), /no key named nobody/);
});
