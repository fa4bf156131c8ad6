// Round 4, point 1 (docs/credentials.md, "Set aside"): the voice provider
// answers 401 for reasons a client controls. A scoped account key answers
// `401 {"detail":{"status":"missing_permissions",…}}` for any endpoint
// outside its scope, and one request of one key to `/speech/v1/user` used to
// set both credentials aside until a reload, so every other key got 503
// upstream_credentials_exhausted. A 401 sets a credential aside only when
// the provider's own body says the account is refused: `invalid_api_key`
// until a reload, `quota_exceeded` as a 402; anything else is the client's.
import assert from 'node:assert/strict';
import { gzipSync } from 'node:zlib';
import { test } from 'node:test';
import { createKey } from '../../src/keys/manage.ts';
import { speechUnauthorized } from '../../src/request/routes.ts';
import { request } from '../support/client.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { startUpstream, type MockUpstream } from '../support/upstream.ts';

const SCOPED = { detail: { status: 'missing_permissions', message: 'The API key you used is missing the permission user_read to execute this operation.' } };

/** Two speech credentials; `unauthorized(label, path)` gives a 401's body (and its headers) or null for a 200. */
async function withPool(
  unauthorized: (label: number, path: string) => { body: Buffer | string; headers?: Record<string, string> } | null,
  run: (gw: TestGateway, up: MockUpstream, keys: readonly string[]) => Promise<void>,
  env: Record<string, string> = {},
): Promise<void> {
  const tag = Math.random().toString(36).slice(2, 10);
  const keys = [`sk_POOLONE${tag}`, `sk_POOLTWO${tag}`];
  const up = await startUpstream((req, res) => {
    req.resume();
    req.on('end', () => {
      const label = keys.indexOf(String(req.headers['xi-api-key'])) + 1;
      const refusal = unauthorized(label, (req.url ?? '').split('?')[0] as string);
      if (refusal !== null) {
        const body = Buffer.from(refusal.body);
        res.writeHead(401, { 'content-type': 'application/json', 'content-length': body.length, ...refusal.headers });
        res.end(body);
        return;
      }
      const body = JSON.stringify({ credential: label });
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    });
  });
  const gw = await startGateway({
    speech: up.url,
    secrets: { speech: [keys[0] as string] },
    env: { KEYWARD_CREDENTIAL_ORDER: 'first', KEYWARD_SPEECH_KEY_2: keys[1] as string, ...env },
  });
  try {
    await run(gw, up, keys);
  } finally {
    await gw.close();
    await up.close();
  }
}

const get = (gw: TestGateway, token: string, path: string) => request(`${gw.url}/speech${path}`, { headers: { authorization: `Bearer ${token}` } });

test("one key's requests outside a scoped account key's scope never make the route unavailable to another key", async () => {
  await withPool(
    (_label, path) => (path === '/v1/user' ? { body: JSON.stringify(SCOPED) } : null),
    async (gw, up) => {
      const other = await createKey(gw.store, 'other-client');
      for (let i = 0; i < 10; i++) {
        const r = await get(gw, gw.token, '/v1/user');
        assert.equal(r.status, 401, 'the provider answer is the client’s');
        assert.deepEqual(JSON.parse(r.body.toString()), SCOPED, 'passed on unchanged');
      }
      assert.equal(up.requests.length, 10, 'each sent once: a refusal of the call is not retried on another account');
      assert.deepEqual(gw.gateway.readiness().credentials, { speech: { available: 2, total: 2 } }, 'nothing set aside');
      assert.ok(!(gw.gateway.readiness().credentialsExhausted ?? []).includes('speech'));
      // The other key (the gateway reads the new key within its poll).
      let answer = await get(gw, other.token, '/v1/voices');
      for (let i = 0; i < 50 && answer.status === 401; i++) {
        await new Promise((r) => setTimeout(r, 100));
        answer = await get(gw, other.token, '/v1/voices');
      }
      assert.equal(answer.status, 200);
      assert.equal(JSON.parse(answer.body.toString()).credential, 1, 'the first credential still serves');
      assert.ok(!gw.logs().some((l) => l.msg === 'credential set aside' || (l.level === 50 && l.credential !== undefined)), 'no credential logged as refused');
    },
  );
});

test('a 401 per status: invalid_api_key until a reload and retried, quota_exceeded as a 402 and retried, every other status passed on', async () => {
  const cases: Array<{ name: string; body: Buffer | string; headers?: Record<string, string>; aside: boolean; payment?: true; undecodable?: true }> = [
    { name: 'invalid_api_key', body: JSON.stringify({ detail: { status: 'invalid_api_key', message: 'Invalid API key' } }), aside: true },
    {
      name: 'quota_exceeded',
      body: JSON.stringify({ detail: { status: 'quota_exceeded', message: 'This request exceeds your quota.' } }),
      aside: true,
      payment: true,
    },
    {
      name: 'invalid_api_key, gzip',
      body: gzipSync(JSON.stringify({ detail: { status: 'invalid_api_key', message: 'Invalid API key' } })),
      headers: { 'content-encoding': 'gzip' },
      aside: true,
    },
    { name: 'missing_permissions', body: JSON.stringify(SCOPED), aside: false },
    { name: 'detected_unusual_activity', body: JSON.stringify({ detail: { status: 'detected_unusual_activity', message: 'x' } }), aside: false },
    { name: 'a plain string detail', body: JSON.stringify({ detail: 'invalid_api_key' }), aside: false },
    { name: 'not JSON', body: '<html>401 Unauthorized</html>', aside: false },
    { name: 'empty', body: '', aside: false },
    // Nothing set aside; the relay answers 502 for a body it cannot scan, as for any answer.
    { name: 'gzip that does not decode', body: Buffer.from('not gzip at all'), headers: { 'content-encoding': 'gzip' }, aside: false, undecodable: true },
    { name: 'over 16 KiB', body: JSON.stringify({ detail: { status: 'invalid_api_key', message: 'x'.repeat(20_000) } }), aside: false },
  ];
  for (const c of cases) {
    await withPool(
      (label) => (label === 1 ? { body: c.body, ...(c.headers === undefined ? {} : { headers: c.headers }) } : null),
      async (gw, up) => {
        const r = await get(gw, gw.token, '/v1/voices');
        const ready = gw.gateway.readiness();
        if (c.aside) {
          assert.equal(r.status, 200, `${c.name}: retried on the second credential`);
          assert.equal(JSON.parse(r.body.toString()).credential, 2, c.name);
          assert.equal(up.requests.length, 2, c.name);
          assert.deepEqual(ready.credentials, { speech: { available: 1, total: 2 } }, `${c.name}: the first set aside`);
          // A reload brings back a credential refused as such, never one out of credit.
          gw.gateway.reconfigure(gw.config);
          const after = gw.gateway.readiness().credentials;
          assert.deepEqual(after, { speech: { available: c.payment === true ? 1 : 2, total: 2 } }, `${c.name}: after a reload`);
        } else {
          if (c.undecodable === true) assert.equal(r.status, 502, c.name);
          else {
            assert.equal(r.status, 401, `${c.name}: the answer is the client's`);
            assert.ok(r.body.equals(Buffer.from(c.body)), `${c.name}: byte for byte`);
          }
          assert.equal(up.requests.length, 1, `${c.name}: not retried`);
          assert.deepEqual(ready.credentials, { speech: { available: 2, total: 2 } }, `${c.name}: nothing set aside`);
        }
      },
    );
  }
});

test('the scraper platform: any 401 refuses the account; its 403 insufficient-permissions sets nothing aside', async () => {
  const tag = Math.random().toString(36).slice(2, 10);
  const tokens = [`apify_api_ONE${tag}`, `apify_api_TWO${tag}`];
  let status = 401;
  const up = await startUpstream((req, res) => {
    req.resume();
    req.on('end', () => {
      const label = tokens.findIndex((t) => req.headers.authorization === `Bearer ${t}`) + 1;
      const body =
        label === 1
          ? JSON.stringify({ error: { type: status === 401 ? 'token-not-valid' : 'insufficient-permissions', message: 'x' } })
          : JSON.stringify({ data: { credential: label } });
      res.writeHead(label === 1 ? status : 200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
      res.end(body);
    });
  });
  const gw = await startGateway({
    scraper: up.url,
    secrets: { scraper: [tokens[0] as string] },
    env: { KEYWARD_CREDENTIAL_ORDER: 'first', KEYWARD_SCRAPER_TOKEN_2: tokens[1] as string },
  });
  try {
    const call = () =>
      request(`${gw.url}/scraper/v2/acts/a~b/runs?waitForFinish=0`, {
        method: 'POST',
        headers: { authorization: `Bearer ${gw.token}`, 'content-type': 'application/json' },
        body: '{}',
      });
    status = 403;
    assert.equal((await call()).status, 403);
    assert.deepEqual(gw.gateway.readiness().credentials, { scraper: { available: 2, total: 2 } }, '403: nothing set aside');
    status = 401;
    const r = await call();
    assert.equal(r.status, 200, 'retried on the second');
    assert.deepEqual(gw.gateway.readiness().credentials, { scraper: { available: 1, total: 2 } }, '401: the account refused');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('speechUnauthorized reads detail.status only', () => {
  const of = (v: unknown): string => speechUnauthorized(Buffer.from(JSON.stringify(v)));
  assert.equal(of({ detail: { status: 'invalid_api_key' } }), 'account');
  assert.equal(of({ detail: { status: 'quota_exceeded' } }), 'payment');
  assert.equal(of({ detail: { status: 'missing_permissions' } }), 'call');
  assert.equal(of({ status: 'invalid_api_key' }), 'call');
  assert.equal(of(null), 'call');
  assert.equal(of([]), 'call');
  assert.equal(speechUnauthorized(null), 'call');
  assert.equal(speechUnauthorized(Buffer.from('{')), 'call');
});
