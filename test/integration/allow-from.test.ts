// docs/keys.md, "Allowed addresses": a key with an allowlist is refused from
// any other address with 403 forbidden, nothing forwarded and nothing
// counted against its limits; behind trusted proxies the address is read
// from X-Forwarded-For, and never otherwise.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';
import { runCli } from '../support/cli.ts';
import { withFleet } from '../support/fleet.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

/** A request from `from` (a loopback address of this host). */
function from(gw: TestGateway, localAddress: string, headers: http.OutgoingHttpHeaders = {}, path = '/seo/v3/x'): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${gw.url}${path}`, { localAddress, headers: { authorization: `Bearer ${gw.token}`, ...headers }, agent: false }, (res) => {
      let body = '';
      res.on('data', (c: Buffer) => (body += c.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', reject);
    req.end();
  });
}

test('an allowlisted key: 403 from elsewhere, nothing forwarded or counted; served from inside its ranges', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, limits: { quota: '2/day', allowFrom: ['127.0.0.2', '10.0.0.0/8'] } });
  try {
    for (let i = 0; i < 5; i++) {
      const r = await from(gw, '127.0.0.1');
      assert.equal(r.status, 403);
      assert.deepEqual(JSON.parse(r.body), { error: 'This key is not allowed from this address.', code: 'forbidden' });
    }
    // An X-Forwarded-For from a client that is no trusted proxy is not believed.
    assert.equal((await from(gw, '127.0.0.1', { 'x-forwarded-for': '10.1.2.3' })).status, 403);
    assert.equal(up.requests.length, 0, 'nothing forwarded');
    // The quota of 2 is whole: nothing refused was counted.
    assert.equal((await from(gw, '127.0.0.2')).status, 200);
    assert.equal((await from(gw, '127.0.0.2')).status, 200);
    assert.equal((await from(gw, '127.0.0.2')).status, 429);
    const m = await gw.gateway.metrics.text();
    assert.match(m, /keyward_limited_total\{route="none",reason="address"\} 6/);
    // Its own status from elsewhere: refused too.
    assert.equal((await from(gw, '127.0.0.1', {}, '/keyward/key')).status, 403);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('behind trusted proxies: the nearest untrusted X-Forwarded-For address is the client', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, limits: { allowFrom: ['203.0.113.0/24'] }, env: { KEYWARD_TRUSTED_PROXIES: '127.0.0.1, 10.0.0.0/8' } });
  try {
    assert.equal((await from(gw, '127.0.0.1', { 'x-forwarded-for': '203.0.113.7' })).status, 200);
    assert.equal((await from(gw, '127.0.0.1', { 'x-forwarded-for': '203.0.113.7, 10.0.0.1' })).status, 200, 'past a trusted hop');
    // A client cannot smuggle an allowed address in front of its own.
    assert.equal((await from(gw, '127.0.0.1', { 'x-forwarded-for': '203.0.113.7, 198.51.100.1' })).status, 403);
    // A socket that is no trusted proxy: its own address, whatever the header says.
    assert.equal((await from(gw, '127.0.0.2', { 'x-forwarded-for': '203.0.113.7' })).status, 403);
    assert.equal(up.requests.length, 2);
    // The header itself still goes upstream as the client sent it.
    assert.equal(up.requests[0]?.headers['x-forwarded-for'], '203.0.113.7');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('keys create --allow-from and keys update --allow-from none; bad ranges refused with the rule; a bad KEYWARD_TRUSTED_PROXIES names itself', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  const env = { KEYWARD_KEYS_FILE: gw.config.keysFile };
  try {
    const made = await runCli(['keys', 'create', '--name', 'office', '--allow-from', '127.0.0.2,2001:db8::/32', '--json'], env);
    assert.equal(made.code, 0, made.stderr);
    const key = JSON.parse(made.stdout) as { token: string };
    const status = async (local: string): Promise<number> =>
      new Promise((resolve, reject) => {
        http
          .get(`${gw.url}/seo/v3/x`, { localAddress: local, headers: { authorization: `Bearer ${key.token}` }, agent: false }, (res) => {
            res.resume();
            resolve(res.statusCode ?? 0);
          })
          .on('error', reject);
      });
    const { eventually } = await import('../support/deadline.ts');
    await eventually(async () => (await status('127.0.0.2')) === 200, 5_000, 'the new key served from its address');
    assert.equal(await status('127.0.0.1'), 403);
    const list = await runCli(['keys', 'list'], env);
    assert.match(list.stdout, /from 127\.0\.0\.2,2001:db8::\/32/);
    assert.equal((await runCli(['keys', 'update', 'office', '--allow-from', 'none'], env)).code, 0);
    await eventually(async () => (await status('127.0.0.1')) === 200, 5_000, 'allowed from anywhere again');
    const bad = await runCli(['keys', 'create', '--name', 'x', '--allow-from', '10.0.0.0/33'], env);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--allow-from must be 1 to 64 address ranges/);
    const none = await runCli(['keys', 'create', '--name', 'y', '--allow-from', 'none'], env);
    assert.equal(none.code, 2);
    const conf = await runCli(['serve'], { ...env, KEYWARD_TRUSTED_PROXIES: 'proxy.internal', KEYWARD_PORT: '0' });
    assert.equal(conf.code, 2);
    assert.match(conf.stderr, /KEYWARD_TRUSTED_PROXIES: proxy\.internal is not an address range/);
  } finally {
    await gw.close();
    await up.close();
  }
});

/** A request to `base` with `token` from the loopback address `localAddress`: its status. */
function statusFrom(base: string, token: string, localAddress: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = http.request(`${base}/seo/v3/x`, { localAddress, headers: { authorization: `Bearer ${token}` }, agent: false }, (res) => {
      res.resume();
      res.on('end', () => resolve(res.statusCode ?? 0));
    });
    req.on('error', reject);
    req.end();
  });
}

test(
  'two gateways with two workers each on one PostgreSQL: refused from elsewhere on every process, nothing forwarded, the quota whole for the allowed address',
  { timeout: 240_000 },
  async () => {
    await withFleet(async (f) => {
      const key = await f.key('pinned', '--quota', '2/day', '--allow-from', '127.0.0.2');
      const a = await f.gateway({ KEYWARD_WORKERS: '2' });
      const b = await f.gateway({ KEYWARD_WORKERS: '2' });
      // Six refusals spread over both gateways and, through fresh connections, over their workers.
      for (let i = 0; i < 6; i++) assert.equal(await statusFrom(i % 2 === 0 ? a.base : b.base, key.token, '127.0.0.1'), 403);
      assert.equal(f.up.requests.length, 0, 'nothing forwarded');
      // The fleet's quota of 2 is whole: nothing refused was counted anywhere.
      assert.equal(await statusFrom(a.base, key.token, '127.0.0.2'), 200);
      assert.equal(await statusFrom(b.base, key.token, '127.0.0.2'), 200);
      assert.equal(await statusFrom(a.base, key.token, '127.0.0.2'), 429);
      assert.equal(f.up.requests.length, 2);
    });
  },
);
