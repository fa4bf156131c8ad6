// A scraper budget attacked as a key holder who knows the rules, and as
// ordinary failing traffic would (docs/limits.md, "Scraper runs"): requests
// that fail on purpose first, another key's traffic, synchronous runs, runs
// set going again with a huge cap, spend scheduled for later, other
// spellings of the path and of the cap, clients that hang up. One gateway
// with its SQLite ledger, a stand-in platform that bills each run at most
// its cap (test/support/platform.ts). The rule under attack: the caps of
// the runs in flight never add up to more than what is left, so what the
// platform bills never passes the budget.
import assert from 'node:assert/strict';
import http from 'node:http';
import { DatabaseSync } from 'node:sqlite';
import { test } from 'node:test';
import { request, type Reply } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { startPlatform, type Platform } from '../support/platform.ts';
import { createKey } from '../../src/keys/manage.ts';

const BUDGET = { budgets: { scraper: '1/day' } };
const QUICK = { everyMs: 50, backoff: { firstMs: 100, maxMs: 400 } };
const auth = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` });

const post = (gw: TestGateway, token: string, path: string): Promise<Reply> =>
  request(`${gw.url}/scraper${path}`, { method: 'POST', headers: { ...auth(token), 'content-type': 'application/json' }, body: '{}', timeoutMs: 20_000 });

/** What the platform would bill: each run's price, at most its cap. */
const billed = (p: Platform): number => Math.round([...p.runs.values()].reduce((n, r) => n + r.cost, 0) * 1e6) / 1e6;
/** The caps the platform was sent, as numbers (Infinity: none). */
const caps = (p: Platform): number[] => [...p.runs.values()].map((r) => r.cap);
const sum = (xs: readonly number[]): number => Math.round(xs.reduce((a, b) => a + b, 0) * 1e6) / 1e6;

/** The scraper's cost and pending runs in the ledger file. */
function ledger(gw: TestGateway): { cost: number; pending: number } {
  const db = new DatabaseSync(`${gw.config.keysFile}.usage.sqlite`, { readOnly: true });
  try {
    const row = db.prepare("select coalesce(sum(cost), 0) as cost from usage where route = 'scraper'").get() as { cost: number };
    const runs = db.prepare('select count(*) as n from runs').get() as { n: number };
    return { cost: Math.round(row.cost * 1e6) / 1e6, pending: runs.n };
  } finally {
    db.close();
  }
}

/** A key created while the gateway runs: once the gateway serves it (the keys file is watched). */
async function liveKey(gw: TestGateway, name: string, limits: { budgets: Record<string, string> } | null): Promise<string> {
  const { token } = await createKey(gw.store, name, limits === null ? {} : { limits });
  await eventually(async () => (await request(`${gw.url}/keyward/key`, { headers: auth(token) })).status === 200, 10_000, `key ${name} served`);
  return token;
}

async function failingFirst(gw: TestGateway, token: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) assert.equal((await post(gw, token, '/v2/acts/x/no-such-endpoint')).status, 404);
}

test('30 failing POSTs, then 50 run-starts at once: the caps add up to the budget at most, and so does what the platform bills', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, limits: BUDGET });
  try {
    await failingFirst(gw, gw.token, 30);
    const replies = await Promise.all(Array.from({ length: 50 }, () => post(gw, gw.token, '/v2/acts/pay-0.30/runs')));
    const admitted = replies.filter((r) => r.status === 201).length;
    assert.ok(admitted >= 1 && admitted <= 10, `${admitted} admitted`);
    for (const r of replies.filter((x) => x.status !== 201)) assert.equal((r.json() as { code: string }).code, 'budget_exceeded');
    assert.equal(p.runs.size, admitted, 'refused starts never reached the platform');
    assert.ok(sum(caps(p)) <= 1, `caps ${caps(p).join(', ')}`);
    assert.ok(billed(p) <= 1, `billed ${billed(p)}`);
  } finally {
    await gw.close();
    await p.close();
  }
});

test("another key's failing POSTs teach nothing: a key never used before starts 50 runs at once within its own budget", async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, limits: BUDGET });
  try {
    await failingFirst(gw, await liveKey(gw, 'noisy', { budgets: { scraper: '100/day' } }), 30);
    const replies = await Promise.all(Array.from({ length: 50 }, () => post(gw, gw.token, '/v2/acts/pay-0.30/runs?maxTotalChargeUsd=0.3')));
    assert.equal(replies.filter((r) => r.status === 201).length, 4, 'three at the 0.3 asked for, one at the 0.1 left');
    assert.deepEqual(caps(p).sort(), [0.1, 0.3, 0.3, 0.3]);
    assert.ok(billed(p) <= 1);
  } finally {
    await gw.close();
    await p.close();
  }
});

test('300 synchronous runs after failing POSTs: each capped and booked at its cap, never more than the budget forwarded', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, env: { KEYWARD_USAGE_FLUSH: '100ms' }, limits: BUDGET });
  try {
    await failingFirst(gw, gw.token, 30);
    const replies: Reply[] = [];
    for (let round = 0; round < 6; round++)
      replies.push(...(await Promise.all(Array.from({ length: 50 }, () => post(gw, gw.token, '/v2/acts/pay-0.30/run-sync-get-dataset-items')))));
    assert.equal(replies.filter((r) => r.status === 201).length, 10);
    assert.equal(p.syncQueries.length, 10);
    assert.ok(billed(p) <= 1);
    // Booked at their caps, as the key's status says.
    const status = (await request(`${gw.url}/keyward/key`, { headers: auth(gw.token) })).json() as { limits: Array<{ kind: string; used: number }> };
    assert.equal(status.limits.find((l) => l.kind === 'budget')?.used, 1);
    await eventually(() => ledger(gw).cost === 1, 5_000, 'booked in the ledger');
  } finally {
    await gw.close();
    await p.close();
  }
});

test('runs set going again with a cap of 99999 are capped like any start: resurrect, reboot, metamorph', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, limits: BUDGET });
  try {
    const started = await post(gw, gw.token, '/v2/acts/never/runs');
    const id = (started.json() as { data: { id: string } }).data.id;
    const verbs = ['resurrect', 'reboot', 'metamorph'];
    const replies = await Promise.all(Array.from({ length: 20 }, (_, i) => post(gw, gw.token, `/v2/actor-runs/${id}/${verbs[i % 3]}?maxTotalChargeUsd=99999`)));
    const forwarded = replies.filter((r) => r.status === 200).length;
    assert.ok(forwarded >= 1, 'a start set going again is forwarded while the budget has room');
    for (const r of replies.filter((x) => x.status !== 200)) assert.equal((r.json() as { code: string }).code, 'budget_exceeded');
    assert.ok(
      caps(p).every((c) => c <= 1),
      `caps ${caps(p).join(', ')}`,
    );
    assert.ok(sum(caps(p)) <= 1, `caps add up to ${sum(caps(p))}`);
  } finally {
    await gw.close();
    await p.close();
  }
});

test('schedules, webhooks and builds: refused 403 budget_unenforceable for a key with a scraper budget (however spelt), forwarded for a key without', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, limits: BUDGET });
  try {
    for (const path of ['/v2/schedules', '/v2/webhooks', '/v2/acts/x/builds', '/v2/SCHEDULES/', '/v2/%73chedules']) {
      const r = await post(gw, gw.token, path);
      assert.equal(r.status, 403, path);
      assert.equal((r.json() as { code: string }).code, 'budget_unenforceable', path);
    }
    assert.deepEqual(p.later, [], 'nothing reached the platform');
    assert.equal((await post(gw, await liveKey(gw, 'no-budget', null), '/v2/schedules')).status, 201);
    assert.deepEqual(p.later, ['/v2/schedules']);
  } finally {
    await gw.close();
    await p.close();
  }
});

test('other spellings of the cap and of the path: the platform always sees one plain cap within what is left', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, limits: BUDGET });
  try {
    for (const path of [
      '/v2/acts/a/runs?maxTotalChargeUsd[]=0.01',
      '/v2/acts/a/runs?maxTotalChargeUsd%5Ba%5D=0.01',
      '/v2/ACTS/a/RUNS',
      '/v2/acts/a/runs/',
      '/v2/%61cts/a/runs?MAXTOTALCHARGEUSD=50',
    ])
      assert.equal((await post(gw, gw.token, path)).status, 201, path);
    for (const r of p.runs.values()) {
      const spellings = [...new URLSearchParams(r.query).keys()].filter((k) => k.toLowerCase().startsWith('maxtotalchargeusd'));
      assert.deepEqual(spellings, ['maxTotalChargeUsd'], r.query);
      assert.equal(r.cap, 0.1, r.query);
    }
  } finally {
    await gw.close();
    await p.close();
  }
});

test('run-starts whose clients hang up before the answer: each read to its end, its run recorded and settled at what it cost', async () => {
  const p = await startPlatform();
  p.startDelayMs = 3_000;
  const gw = await startGateway({ scraper: p.up.url, env: { KEYWARD_USAGE_FLUSH: '100ms' }, settle: QUICK, limits: BUDGET });
  try {
    const hangUp = (): Promise<string> =>
      new Promise((resolve) => {
        const req = http.request(`${gw.url}/scraper/v2/acts/quick-0.05/runs`, { method: 'POST', headers: auth(gw.token), agent: false });
        req.on('error', (err) => resolve(err.message));
        req.on('response', (res) => {
          res.resume();
          resolve(`answered ${res.statusCode}`);
        });
        req.end('{}');
        // Long enough for the start to reach the platform on a loaded machine; well before its answer.
        setTimeout(() => req.destroy(), 1_000);
      });
    const outcomes = await Promise.all(Array.from({ length: 15 }, hangUp));
    assert.ok(
      outcomes.every((o) => !o.startsWith('answered 201')),
      outcomes.join('; '),
    );
    // Ten admitted at a tenth of the budget each; five refused at once (they got their 429 before hanging up).
    await eventually(() => p.runs.size === 10, 10_000, 'ten runs started');
    await eventually(() => ledger(gw).pending === 0 && ledger(gw).cost === billed(p), 20_000, 'every run settled');
    assert.equal(billed(p), 0.5);
    assert.ok(
      [...p.runs.values()].every((r) => r.asked >= 1),
      'each run was asked about',
    );
    const settled = gw.logs().filter((l) => l.msg === 'scraper run settled').length;
    assert.equal(settled, 10);
  } finally {
    await gw.close();
    await p.close();
  }
});
