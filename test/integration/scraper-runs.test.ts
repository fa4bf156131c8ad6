// Scraper runs settled after the fact (docs/limits.md, "Scraper runs"), one
// gateway over real sockets with the SQLite ledger beside the keys file and
// a stand-in platform (test/support/platform.ts).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli, startCli } from '../support/cli.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { startPlatform } from '../support/platform.ts';
import { parseProm } from '../support/prom.ts';

const auth = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` });
/** Settling at a test's pace: a round every 50 ms, questions again after 100 ms, 200 ms, … */
const QUICK = { everyMs: 50, backoff: { firstMs: 100, maxMs: 400 } };

/** The scraper's cost and requests in the ledger file, and its pending runs. */
function ledger(gw: TestGateway): { cost: number; requests: number; pending: number } {
  const db = new DatabaseSync(`${gw.config.keysFile}.usage.sqlite`, { readOnly: true });
  try {
    const row = db.prepare("select coalesce(sum(cost), 0) as cost, coalesce(sum(requests), 0) as requests from usage where route = 'scraper'").get() as {
      cost: number;
      requests: number;
    };
    const runs = db.prepare('select count(*) as n from runs').get() as { n: number };
    return { cost: Math.round(row.cost * 1e6) / 1e6, requests: row.requests, pending: runs.n };
  } finally {
    db.close();
  }
}

const start = (gw: TestGateway, actor: string, query = ''): Promise<{ status: number; json: () => unknown }> =>
  request(`${gw.url}/scraper/v2/acts/${actor}/runs${query}`, {
    method: 'POST',
    headers: { ...auth(gw.token), 'content-type': 'application/json' },
    body: '{"startUrls":[]}',
  });

test('runs are settled once they end: each booked once at its usageTotalUsd on its start day, asked with the master credential, never with the client token', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, env: { KEYWARD_USAGE_FLUSH: '100ms' }, settle: QUICK });
  try {
    for (const actor of ['quick-0.25', 'slow-0.40', 'fails-0.05']) assert.equal((await start(gw, actor)).status, 201);
    await eventually(() => ledger(gw).pending === 0 && ledger(gw).requests === 3, 15_000, 'three runs settled');
    assert.deepEqual(ledger(gw), { cost: 0.7, requests: 3, pending: 0 });
    // Each run asked until it ended, and not after.
    for (const run of p.runs.values()) assert.ok(run.asked >= 1, `${run.actor} asked`);
    const asks = p.up.requests.filter((r) => r.method === 'GET');
    assert.ok(asks.length >= 3);
    for (const a of asks) {
      assert.equal(a.headers.authorization, `Bearer ${gw.secrets.scraperToken}`);
      assert.match(a.url, /^\/v2\/actor-runs\/run\d+x[a-z0-9]+$/);
    }
    assert.equal(p.up.raw().includes(gw.token), false, 'the client token never reached the platform');
    // A slow run was asked more than once; after it was settled it is asked no more.
    const after = p.up.requests.length;
    await new Promise((r) => setTimeout(r, 300));
    assert.equal(p.up.requests.length, after, 'nothing asked once every run was settled');
    const m = parseProm(await gw.gateway.metrics.text());
    assert.equal(m.sum('keyward_runs_settled_total', {}), 3);
    assert.equal(gw.logText().includes(gw.secrets.scraperToken), false, 'the master credential is in no log line');
    const settled = gw.logs().filter((l) => l.msg === 'scraper run settled');
    assert.deepEqual(settled.map((l) => l.cost).sort(), [0.05, 0.25, 0.4]);
    // The usage page charts the scraper's spend per day like the other routes'.
    const html = await gw.gateway.usagePage(new URLSearchParams());
    assert.match(html, /Spend per day on scraper \(usd\)/);
    const today = new Date().toISOString().slice(0, 10);
    assert.match(html, new RegExp(`<rect class="bar"[^>]*data-day="${today}" data-route="scraper" data-cost="0\\.7"`));
  } finally {
    await gw.close();
    await p.close();
  }
});

test("a scraper budget: each run capped at the key's run cap or what is left, whichever is less (the query otherwise byte for byte), refused once spent, the key status showing settled spend", async () => {
  const p = await startPlatform();
  const gw = await startGateway({
    scraper: p.up.url,
    env: { KEYWARD_USAGE_FLUSH: '100ms' },
    settle: QUICK,
    limits: { budgets: { scraper: '1/day' }, runCap: 0.5, alerts: [50] },
  });
  try {
    const caps: string[] = [];
    const alerts = async (): Promise<number> =>
      parseProm(await gw.gateway.metrics.text()).sum('keyward_limit_alerts_total', { kind: 'budget', threshold: '50' });
    for (let i = 0; i < 4; i++) {
      const r = await start(gw, 'quick-0.30', '?build=latest&memory=256');
      assert.equal(r.status, 201, `run ${i + 1}`);
      await eventually(() => ledger(gw).pending === 0 && ledger(gw).requests === i + 1, 15_000, `run ${i + 1} settled`);
      // A run counts at its cap until it is settled: the first, booked at 0.5, reaches 50 % (once, though it settles at 0.3).
      if (i === 0) await eventually(async () => (await alerts()) === 1, 5_000, 'the 50 % alert');
      if (i === 1) assert.equal(await alerts(), 1);
    }
    for (const run of p.runs.values()) caps.push(run.query);
    // The key's run cap while more is left; 1 - 0.3 - 0.3 leaves 0.4, then 0.1: the fourth run is capped there and costs 0.1.
    assert.deepEqual(caps, [
      '?build=latest&memory=256&maxTotalChargeUsd=0.5',
      '?build=latest&memory=256&maxTotalChargeUsd=0.5',
      '?build=latest&memory=256&maxTotalChargeUsd=0.4',
      '?build=latest&memory=256&maxTotalChargeUsd=0.1',
    ]);
    assert.equal(ledger(gw).cost, 1);
    const refused = await start(gw, 'quick-0.30');
    assert.equal(refused.status, 429);
    const body = refused.json() as { code: string; limit: { kind: string; route: string; value: number; used: number; unit: string } };
    assert.equal(body.code, 'budget_exceeded');
    assert.deepEqual(
      { kind: body.limit.kind, route: body.limit.route, value: body.limit.value, used: body.limit.used, unit: body.limit.unit },
      { kind: 'budget', route: 'scraper', value: 1, used: 1, unit: 'usd' },
    );
    assert.equal(p.runs.size, 4, 'the refused run never reached the platform');
    const status = (await request(`${gw.url}/keyward/key`, { headers: auth(gw.token) })).json() as {
      limits: Array<{ kind: string; route: string | null; used: number; remaining: number }>;
    };
    const budget = status.limits.find((l) => l.kind === 'budget' && l.route === 'scraper');
    assert.deepEqual({ used: budget?.used, remaining: budget?.remaining }, { used: 1, remaining: 0 });
    assert.equal((status as unknown as { runCap: number | null }).runCap, 0.5, 'the run cap in the key status');
    // The usage page lists the key past its budget, with its run cap beside the budget.
    assert.match(await gw.gateway.usagePage(new URLSearchParams()), /budget scraper 1\/day, runs capped at 0\.5/);
  } finally {
    await gw.close();
    await p.close();
  }
});

test('a client asking for a lower cap keeps it byte for byte and reserves only that; a higher one is replaced by what is left', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, settle: QUICK, limits: { budgets: { scraper: '2/day' } } });
  try {
    assert.equal((await start(gw, 'never', '?maxTotalChargeUsd=0.05&x=%20y')).status, 201);
    assert.equal((await start(gw, 'never', '?maxTotalChargeUsd=99&x=1')).status, 201);
    const queries = [...p.runs.values()].map((r) => r.query);
    assert.equal(queries[0], '?maxTotalChargeUsd=0.05&x=%20y');
    // Two runs pending: the first reserved its own 0.05, so 1.95 is left for the second.
    assert.equal(queries[1], '?x=1&maxTotalChargeUsd=1.95');
    assert.equal(queries.length, 2);
    // Nothing is left: a third run is refused, whatever it asks for.
    const third = await start(gw, 'never', '?maxTotalChargeUsd=0.01');
    assert.equal(third.status, 429);
    assert.equal(p.runs.size, 2);
  } finally {
    await gw.close();
    await p.close();
  }
});

test('pending runs survive a restart and a platform that is down: settled once by the next start, once the platform answers', async () => {
  const p = await startPlatform();
  const dir = mkdtempSync(join(tmpdir(), 'keyward-runs-'));
  p.down = true;
  try {
    const first = await startGateway({ dir, scraper: p.up.url, env: { KEYWARD_USAGE_FLUSH: '100ms' }, settle: QUICK });
    try {
      for (const actor of ['slow-0.40', 'quick-0.25']) assert.equal((await start(first, actor)).status, 201);
      await eventually(
        async () => parseProm(await first.gateway.metrics.text()).sum('keyward_run_checks_failed_total', { reason: 'the upstream answered 503' }) >= 2,
        10_000,
        'the platform was asked (and was down)',
      );
    } finally {
      await first.close();
    }
    // Stopped with both runs pending: their reservations (0, no budget) booked, the runs kept;
    // `keyward usage` marks the day that holds them.
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const rows = JSON.parse((await runCli(['usage', '--json', '--route', 'scraper'], env)).stdout) as Array<{ requests: number; pendingRuns: number }>;
    assert.deepEqual(
      rows.map((r) => ({ requests: r.requests, pendingRuns: r.pendingRuns })),
      [{ requests: 2, pendingRuns: 2 }],
    );
    const table = (await runCli(['usage', '--route', 'scraper'], env)).stdout;
    assert.match(table, /\b0\*\s+usd/);
    assert.match(table, /^\* 2 scraper runs still pending: booked at their reservations until they end/m);
    const second = await startGateway({
      dir,
      keyName: 'after-restart',
      scraper: p.up.url,
      env: { KEYWARD_USAGE_FLUSH: '100ms' },
      settle: QUICK,
      secrets: { scraper: [first.secrets.scraperToken] },
    });
    try {
      assert.equal(ledger(second).pending, 2);
      p.down = false;
      await eventually(() => ledger(second).pending === 0, 15_000, 'settled after the restart');
      assert.deepEqual(ledger(second), { cost: 0.65, requests: 2, pending: 0 });
      // Each run was asked once it ended, by the second start only: booked once.
      assert.equal(second.logs().filter((l) => l.msg === 'scraper run settled').length, 2);
    } finally {
      await second.close();
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await p.close();
  }
});

test('a run that never ends is given up at the give-up age with a warning; answers that are no run object are asked again, nothing crashes', async () => {
  const p = await startPlatform();
  const gw = await startGateway({
    scraper: p.up.url,
    env: { KEYWARD_USAGE_FLUSH: '100ms' },
    settle: { ...QUICK, giveUpMs: 1_500 },
    limits: { budgets: { scraper: '5/day' } },
  });
  try {
    p.garbage = true;
    assert.equal((await start(gw, 'never')).status, 201);
    await eventually(() => p.up.requests.filter((r) => r.method === 'GET').length >= 2, 10_000, 'asked twice');
    p.garbage = false;
    await eventually(() => gw.logs().some((l) => l.msg?.toString().startsWith('scraper run given up') === true), 10_000, 'given up');
    const m = parseProm(await gw.gateway.metrics.text());
    assert.equal(m.sum('keyward_runs_unsettled_total', {}), 1);
    assert.ok(m.sum('keyward_run_checks_failed_total', { reason: 'the answer is not a run object' }) >= 1);
    await eventually(() => ledger(gw).pending === 0, 5_000, 'the run forgotten');
    // Its reservation (its cap: a tenth of the 5 USD budget) stays booked as its cost: the safe direction.
    assert.deepEqual(ledger(gw), { cost: 0.5, requests: 1, pending: 0 });
    // The gateway still serves.
    assert.equal((await start(gw, 'quick-0.10')).status, 201);
  } finally {
    await gw.close();
    await p.close();
  }
});

test('synchronous runs are counted, capped like run-starts, booked at their reservation and never settled; an error answer books nothing', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, env: { KEYWARD_USAGE_FLUSH: '100ms' }, settle: QUICK, limits: { budgets: { scraper: '1/day' } } });
  try {
    const post = (path: string): Promise<{ status: number }> =>
      request(`${gw.url}/scraper/v2${path}`, { method: 'POST', headers: { ...auth(gw.token), 'content-type': 'application/json' }, body: '{}' });
    assert.equal((await post('/acts/a~b/run-sync-get-dataset-items?format=json')).status, 201);
    assert.equal((await post('/actor-tasks/t/run-sync')).status, 201);
    assert.equal((await post('/acts/missing/run-sync')).status, 404);
    // A tenth of the budget each: the default share of a run that asks for nothing.
    assert.deepEqual(p.syncQueries, ['?format=json&maxTotalChargeUsd=0.1', '?maxTotalChargeUsd=0.1', '?maxTotalChargeUsd=0.1']);
    await eventually(() => ledger(gw).requests === 3, 5_000, 'three counted');
    await new Promise((r) => setTimeout(r, 300));
    // Two booked at their caps, the refused one at nothing; none pending, none asked about.
    assert.deepEqual(ledger(gw), { cost: 0.2, requests: 3, pending: 0 });
    assert.equal(p.up.requests.filter((r) => r.method === 'GET').length, 0);
  } finally {
    await gw.close();
    await p.close();
  }
});

test('KEYWARD_WORKERS=2: the primary settles the runs the workers started, caps them from one budget, and an alert of a settled run fires', async () => {
  const p = await startPlatform();
  const dir = mkdtempSync(join(tmpdir(), 'keyward-runs-w-'));
  const env = {
    KEYWARD_PORT: '0',
    KEYWARD_ADMIN_PORT: '0',
    KEYWARD_WORKERS: '2',
    KEYWARD_USAGE_FLUSH: '100ms',
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SCRAPER_URL: p.up.url,
    KEYWARD_SCRAPER_TOKEN: 'apify_api_workersmaster0123456789',
  };
  const key = JSON.parse((await runCli(['keys', 'create', '--name', 'w', '--budget', 'scraper=1/day', '--alert-at', '50%', '--json'], env)).stdout) as {
    token: string;
  };
  const serve = await startCli(['serve'], env, '"msg":"admin listening"');
  try {
    await eventually(() => serve.output().split('"msg":"keyward listening"').length === 3, 10_000, 'two workers listening');
    const port = (msg: string): number =>
      (
        JSON.parse(
          serve
            .output()
            .split('\n')
            .find((l) => l.includes(`"msg":"${msg}"`)) as string,
        ) as { port: number }
      ).port;
    const base = `http://127.0.0.1:${port('keyward listening')}`;
    const admin = `http://127.0.0.1:${port('admin listening')}`;
    const file = (): { cost: number; pending: number; requests: number } => {
      const db = new DatabaseSync(join(dir, 'keys.json.usage.sqlite'), { readOnly: true });
      try {
        const u = db.prepare("select coalesce(sum(cost), 0) as cost, coalesce(sum(requests), 0) as requests from usage where route = 'scraper'").get() as {
          cost: number;
          requests: number;
        };
        return { cost: Math.round(u.cost * 1e6) / 1e6, requests: u.requests, pending: (db.prepare('select count(*) as n from runs').get() as { n: number }).n };
      } finally {
        db.close();
      }
    };
    for (let i = 0; i < 3; i++) {
      const r = await request(`${base}/scraper/v2/acts/quick-0.30/runs?maxTotalChargeUsd=0.5`, {
        method: 'POST',
        headers: { authorization: `Bearer ${key.token}` },
        body: '{}',
      });
      assert.equal(r.status, 201, `run ${i + 1}`);
      await eventually(() => file().requests === i + 1 && file().pending === 0, 15_000, `run ${i + 1} settled`);
    }
    assert.deepEqual(
      [...p.runs.values()].map((r) => r.query),
      // The client's own 0.5 while that much is left, then what is left.
      ['?maxTotalChargeUsd=0.5', '?maxTotalChargeUsd=0.5', '?maxTotalChargeUsd=0.4'],
    );
    assert.equal(file().cost, 0.9);
    await eventually(
      async () => parseProm((await request(`${admin}/metrics`)).body.toString()).sum('keyward_runs_settled_total', {}) === 3,
      5_000,
      'three settled, by the primary',
    );
    await eventually(
      async () => parseProm((await request(`${admin}/metrics`)).body.toString()).sum('keyward_limit_alerts_total', { kind: 'budget', threshold: '50' }) === 1,
      5_000,
      'the 50 % alert',
    );
  } finally {
    serve.child.kill('SIGTERM');
    await deadline(serve.done, 15_000, 'exit');
    await p.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  'a platform down for a minute: questions back off (a bounded number asked), requests are served meanwhile, and every run is booked once it answers again',
  { timeout: 150_000 },
  async () => {
    const p = await startPlatform();
    // The default pace but for the longest wait between questions (5 min by default; 8 s here, so the test ends soon after the outage).
    const gw = await startGateway({
      scraper: p.up.url,
      env: { KEYWARD_USAGE_FLUSH: '200ms' },
      settle: { backoff: { firstMs: 1_000, maxMs: 8_000, jitter: 0.2 } },
    });
    try {
      p.down = true;
      const downSince = Date.now();
      for (const actor of ['quick-0.10', 'quick-0.20', 'fails-0.30']) assert.equal((await start(gw, actor)).status, 201);
      while (Date.now() - downSince < 60_000) {
        // Served at once while the platform does not answer questions about runs.
        const t = performance.now();
        assert.equal((await start(gw, 'never')).status, 201);
        assert.ok(performance.now() - t < 2_000, 'a run-start is never held up by the settler');
        await new Promise((r) => setTimeout(r, 10_000));
      }
      const asked = p.up.requests.filter((r) => r.method === 'GET').length;
      // Per run, doubling from 1 s to 8 s over a minute: at most about 11 questions (1+2+4+8×…); 10 runs at most pending.
      assert.ok(asked <= 10 * 12, `${asked} questions during the outage`);
      p.down = false;
      await eventually(
        () => [...p.runs.values()].filter((r) => !r.actor.startsWith('never')).every((r) => r.asked >= 1) && ledger(gw).cost >= 0.6 - 1e-9,
        20_000,
        'booked once it answered',
      );
      await new Promise((r) => setTimeout(r, 500));
      // The three that ended: 0.6; the never-ending ones are pending at their reservation (0: no budget).
      assert.equal(ledger(gw).cost, 0.6);
      const m = parseProm(await gw.gateway.metrics.text());
      assert.equal(m.sum('keyward_runs_settled_total', {}), 3);
      assert.ok(m.sum('keyward_run_checks_failed_total', { reason: 'the upstream answered 503' }) >= 3);
    } finally {
      await gw.close();
      await p.close();
    }
  },
);

test('overlapping run-starts against a scraper budget: the caps of the runs in flight add up to the budget at most, the rest refused and never forwarded', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, settle: QUICK, limits: { budgets: { scraper: '1/day' } } });
  try {
    // Runs that never end, asking for nothing: each reserves its default cap, a tenth of the budget.
    const replies = await Promise.all(Array.from({ length: 20 }, () => start(gw, 'never')));
    const admitted = replies.filter((r) => r.status === 201).length;
    assert.equal(admitted, 10, `statuses ${replies.map((r) => r.status).join(',')}`);
    for (const r of replies.filter((x) => x.status !== 201)) assert.equal((r.json() as { code: string }).code, 'budget_exceeded');
    assert.equal(p.runs.size, 10, 'refused run-starts never reached the platform');
    const caps = [...p.runs.values()].map((r) => Number(new URLSearchParams(r.query).get('maxTotalChargeUsd')));
    assert.deepEqual(
      caps,
      Array.from({ length: 10 }, () => 0.1),
    );
  } finally {
    await gw.close();
    await p.close();
  }
});

test('overlapping run-starts asking for more than a tenth: each reserves what it asked while that much is left, the last what is left; the caps add up to the budget exactly', async () => {
  const p = await startPlatform();
  const gw = await startGateway({ scraper: p.up.url, settle: QUICK, limits: { budgets: { scraper: '1/day' } } });
  try {
    const replies = await Promise.all(Array.from({ length: 20 }, () => start(gw, 'never', '?maxTotalChargeUsd=0.35')));
    assert.equal(replies.filter((r) => r.status === 201).length, 3);
    const caps = [...p.runs.values()].map((r) => Number(new URLSearchParams(r.query).get('maxTotalChargeUsd'))).sort();
    assert.deepEqual(caps, [0.3, 0.35, 0.35]);
  } finally {
    await gw.close();
    await p.close();
  }
});

test('with several scraper credentials each run is asked about with the credential that started it, also after a restart', async () => {
  const p = await startPlatform();
  p.slowMs = 2_500;
  const dir = mkdtempSync(join(tmpdir(), 'keyward-runs-creds-'));
  const second = `apify_api_SECONDACCOUNT${Math.random().toString(36).slice(2, 10)}`;
  const env = { KEYWARD_USAGE_FLUSH: '100ms', KEYWARD_SCRAPER_TOKEN_2: second, KEYWARD_CREDENTIAL_ORDER: 'spread' };
  try {
    const gw = await startGateway({ scraper: p.up.url, env, settle: QUICK, dir });
    const token = gw.token;
    for (const actor of ['slow-0.30', 'slow-0.20']) assert.equal((await start(gw, actor)).status, 201);
    const owners = [...p.runs.values()].map((r) => r.owner);
    assert.deepEqual(new Set(owners), new Set([`Bearer ${gw.secrets.scraperToken}`, `Bearer ${second}`]), 'one run on each account');
    await eventually(() => ledger(gw).requests === 2, 5_000, 'both starts in the ledger');
    await gw.close();
    // The next start finds the runs pending, each with its credential.
    const again = await startGateway({ scraper: p.up.url, env, settle: QUICK, dir, keyName: 'after-restart', secrets: { scraper: [gw.secrets.scraperToken] } });
    try {
      await eventually(() => ledger(again).pending === 0, 15_000, 'both runs settled');
      assert.deepEqual(ledger(again), { cost: 0.5, requests: 2, pending: 0 });
      assert.equal(p.foreign, 0, "no run asked about with another account's token");
      const usage = await runCli(['usage', '--by', 'credential', '--json'], { KEYWARD_KEYS_FILE: join(dir, 'keys.json') });
      const costs = (JSON.parse(usage.stdout) as Array<{ credential: number; cost: number }>).map((r) => Math.round(r.cost * 100) / 100).sort();
      assert.deepEqual(costs, [0.2, 0.3], "each account's cost settled on its own row");
      assert.equal(p.up.raw().includes(token), false);
    } finally {
      await again.close();
    }
  } finally {
    await p.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
