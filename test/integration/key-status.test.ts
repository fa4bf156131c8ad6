// A key's own status (docs/limits.md, "A key's own status"): GET /keyward/key
// over real sockets, against the counts the ledger holds, the figures a 429
// gives, another key, a revoked token, and with workers.
import { join } from 'node:path';
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli, startCli } from '../support/cli.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';
import { createKey, revokeKey } from '../../src/keys/manage.ts';
import { SqliteUsageStore, usagePath } from '../../src/ledger/sqlite-store.ts';

const auth = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` });

interface LimitView {
  kind: string;
  route?: string;
  value: number;
  unit: string;
  used: number;
  remaining: number;
  period?: string;
  window?: number;
  burst?: number;
  resetsAt: string | null;
}
interface Status {
  key: { id: string; name: string; routes: string[] | null; expires: string | null };
  limits: LimitView[];
  alertAt: number[];
  usage: {
    today: { day: string; routes: Record<string, { requests: number; cost: number; unit: string | null }> };
    month: { month: string; routes: Record<string, { requests: number; cost: number; unit: string | null }> };
  };
}

/** An upstream whose speech calls cost 30 characters and whose SEO calls cost 0.25 USD. */
async function costingUpstream(): Promise<Awaited<ReturnType<typeof startUpstream>>> {
  return startUpstream((req, res) => {
    req.resume();
    req.on('end', () => {
      if (req.url?.startsWith('/v1/') === true) {
        res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': '30', 'content-length': 3 });
        return void res.end('mp3');
      }
      const body = '{"status_code":20000,"cost":0.25}';
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
      res.end(body);
    });
  });
}

test('GET /keyward/key: each limit with used, remaining and resetsAt, and usage by route, equal to what the ledger holds; a 429 gives the same figures; never counted, never refused', async () => {
  const up = await costingUpstream();
  const gw = await startGateway({ seo: up.url, speech: up.url, limits: { quota: '5/day', budgets: { speech: '100/day' }, rate: '50/s', concurrency: 3 } });
  const status = async (token = gw.token): Promise<{ status: number; body: Status; text: string }> => {
    const r = await request(`${gw.url}/keyward/key`, { headers: auth(token) });
    return { status: r.status, body: r.json() as Status, text: r.body.toString() };
  };
  try {
    const before = await status();
    assert.equal(before.status, 200);
    assert.deepEqual(before.body.key, { id: gw.keyId, name: 'tester', routes: null, expires: null });
    const midnight = new Date(Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate() + 1)).toISOString().replace('.000Z', 'Z');
    const byKind = (s: Status): Record<string, LimitView> => Object.fromEntries(s.limits.map((l) => [l.route ?? l.kind, l]));
    assert.deepEqual(byKind(before.body).quota, { kind: 'quota', value: 5, unit: 'requests', used: 0, remaining: 5, period: 'day', resetsAt: midnight });
    assert.deepEqual(byKind(before.body).speech, {
      kind: 'budget',
      route: 'speech',
      value: 100,
      unit: 'characters',
      used: 0,
      remaining: 100,
      period: 'day',
      resetsAt: midnight,
    });
    assert.equal(byKind(before.body).concurrency?.remaining, 3);
    assert.equal(byKind(before.body).rate?.value, 50);
    assert.deepEqual(before.body.alertAt, [80, 100]);
    assert.deepEqual(before.body.usage.today.routes, {});

    // Two speech calls (30 characters each) and one SEO call (0.25 USD).
    for (let i = 0; i < 2; i++) assert.equal((await request(`${gw.url}/speech/v1/tts`, { method: 'POST', headers: auth(gw.token), body: '{}' })).status, 200);
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: auth(gw.token) })).status, 200);
    // Many status calls: none of them is forwarded, counted, or takes from the quota.
    for (let i = 0; i < 8; i++) assert.equal((await status()).status, 200);
    const after = await status();
    assert.equal(up.requests.length, 3, 'status calls are never forwarded');
    assert.deepEqual({ used: byKind(after.body).quota?.used, remaining: byKind(after.body).quota?.remaining }, { used: 3, remaining: 2 });
    assert.deepEqual({ used: byKind(after.body).speech?.used, remaining: byKind(after.body).speech?.remaining }, { used: 60, remaining: 40 });
    assert.deepEqual(after.body.usage.today.routes, { speech: { requests: 2, cost: 60, unit: 'characters' }, seo: { requests: 1, cost: 0.25, unit: 'usd' } });
    assert.deepEqual(after.body.usage.month.routes, after.body.usage.today.routes);

    // The ledger, as written: the same counts.
    const ledger = new SqliteUsageStore(usagePath(gw.config.keysFile));
    await eventually(async () => (await ledger.rows({ keyId: gw.keyId })).reduce((n, r) => n + r.requests, 0) === 3, 10_000, 'the ledger written');
    const rows = await ledger.rows({ keyId: gw.keyId });
    await ledger.close();
    const today: Record<string, unknown> = after.body.usage.today.routes;
    for (const r of rows) assert.deepEqual(today[r.route], { requests: r.requests, cost: r.cost, unit: r.route === 'speech' ? 'characters' : 'usd' });

    // Up to the quota, then a refusal whose figures are the status's.
    for (let i = 0; i < 2; i++) assert.equal((await request(`${gw.url}/seo/v3/y`, { headers: auth(gw.token) })).status, 200);
    const refused = await request(`${gw.url}/seo/v3/z`, { headers: auth(gw.token) });
    assert.equal(refused.status, 429);
    const limit = (refused.json() as { limit: LimitView }).limit;
    const atRefusal = await status();
    assert.equal(atRefusal.status, 200, 'a key past its quota still reads its status');
    const q = byKind(atRefusal.body).quota as LimitView;
    assert.deepEqual(
      { kind: limit.kind, value: limit.value, used: limit.used, period: limit.period, resetsAt: limit.resetsAt },
      { kind: q.kind, value: q.value, used: q.used, period: q.period, resetsAt: q.resetsAt },
    );
    assert.equal(q.remaining, 0);

    // Never a secret, never the token.
    for (const s of [gw.token, gw.secrets.speechKey, gw.secrets.seoPassword, gw.secrets.seoLogin, gw.secrets.scraperToken])
      assert.ok(!atRefusal.text.includes(s));
  } finally {
    await gw.close();
    await up.close();
  }
});

test('GET /keyward/key: another key sees only itself; unknown and revoked tokens get 401; other /keyward/ paths and methods other than GET 404', async () => {
  const up = await costingUpstream();
  const gw = await startGateway({ seo: up.url, limits: { quota: '10/day' } });
  try {
    const other = await createKey(gw.store, 'other-holder', { routes: ['speech'] });
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: auth(gw.token) })).status, 200);
    // The key set is reloaded from the keys file: wait until the new key opens.
    await eventually(async () => (await request(`${gw.url}/keyward/key`, { headers: auth(other.token) })).status === 200, 10_000, 'new key loaded');
    const r = await request(`${gw.url}/keyward/key`, { headers: auth(other.token) });
    const body = r.json() as Status;
    assert.deepEqual(body.key, { id: other.record.id, name: 'other-holder', routes: ['speech'], expires: null });
    assert.deepEqual(body.limits, []);
    assert.deepEqual(body.usage.today.routes, {});
    assert.ok(!r.body.toString().includes(gw.keyId) && !r.body.toString().includes('tester'), "the first key's data is not in the other's status");

    assert.equal((await request(`${gw.url}/keyward/key`)).status, 401);
    assert.equal((await request(`${gw.url}/keyward/key`, { headers: auth('kw_live_0000000000000000000000000000000000000000000') })).status, 401);
    assert.equal((await request(`${gw.url}/keyward/keys`, { headers: auth(gw.token) })).status, 404);
    assert.equal((await request(`${gw.url}/keyward/`, { headers: auth(gw.token) })).status, 404);
    // A method the path does not take: 404, as on a route (docs/responses.md).
    const post = await request(`${gw.url}/keyward/key`, { method: 'POST', headers: auth(gw.token), body: '{}' });
    assert.deepEqual([post.status, (post.json() as { error: string }).error], [404, 'Method not allowed on this route.']);
    const head = await request(`${gw.url}/keyward/key`, { method: 'HEAD', headers: auth(gw.token) });
    assert.equal(head.status, 200);
    assert.equal(head.body.length, 0);

    await revokeKey(gw.store, other.record.id);
    await eventually(async () => (await request(`${gw.url}/keyward/key`, { headers: auth(other.token) })).status === 401, 10_000, 'revoked token refused');
    assert.equal(up.requests.length, 1);
  } finally {
    await gw.close();
    await up.close();
  }
});

test(
  'GET /keyward/key with two workers: every worker gives the machine-wide figures the primary holds, and usage once written',
  { timeout: 120_000 },
  async () => {
    const up = await costingUpstream();
    const { mkdtempSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const dir = mkdtempSync(join(tmpdir(), 'keyward-status-'));
    const env = {
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      KEYWARD_PORT: '0',
      KEYWARD_ADMIN_PORT: 'off',
      KEYWARD_WORKERS: '2',
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
      KEYWARD_USAGE_FLUSH: '200ms',
    };
    const created = await runCli(['keys', 'create', '--name', 'w', '--quota', '20/day', '--json'], env);
    assert.equal(created.code, 0, created.stderr);
    const token = (JSON.parse(created.stdout) as { token: string }).token;
    const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
    try {
      await eventually(() => gw.output().split('keyward listening').length > 2, 20_000, 'both workers listening');
      const port = (
        JSON.parse(
          gw
            .output()
            .split('\n')
            .find((l) => l.includes('keyward listening')) as string,
        ) as { port: number }
      ).port;
      const base = `http://127.0.0.1:${port}`;
      // New connections each time: the kernel's round robin spreads them over both workers.
      for (let i = 0; i < 6; i++) assert.equal((await request(`${base}/seo/v3/x${i}`, { headers: { ...auth(token), connection: 'close' } })).status, 200);
      const answers = await Promise.all(
        Array.from({ length: 6 }, async () => (await request(`${base}/keyward/key`, { headers: { ...auth(token), connection: 'close' } })).json() as Status),
      );
      for (const a of answers)
        assert.deepEqual(
          a.limits.map((l) => [l.kind, l.used, l.remaining]),
          [['quota', 6, 14]],
        );
      // Usage by route: every worker's counts once written (each flushes every 200 ms).
      await eventually(
        async () =>
          ((await request(`${base}/keyward/key`, { headers: { ...auth(token), connection: 'close' } })).json() as Status).usage.today.routes.seo?.requests ===
          6,
        10_000,
        'usage from the ledger',
      );
    } finally {
      gw.child.kill('SIGTERM');
      await gw.done;
      await up.close();
    }
  },
);
