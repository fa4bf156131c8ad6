// docs/routes.md over real sockets: what reaches which upstream, and what never does.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw, request } from '../support/client.ts';
import { startGateway, type GatewayOptions, type TestGateway } from '../support/gateway.ts';
import { startUpstream, type MockUpstream } from '../support/upstream.ts';

interface Setup {
  gw: TestGateway;
  scraper: MockUpstream;
  seo: MockUpstream;
  speech: MockUpstream;
  auth: { authorization: string };
}

async function withSetup(
  fn: (s: Setup) => Promise<void>,
  options: (u: { scraper: MockUpstream; seo: MockUpstream; speech: MockUpstream }) => GatewayOptions = (u) => ({
    scraper: u.scraper.url,
    seo: u.seo.url,
    speech: u.speech.url,
  }),
): Promise<void> {
  const [scraper, seo, speech] = await Promise.all([startUpstream(), startUpstream(), startUpstream()]);
  const gw = await startGateway(options({ scraper, seo, speech }));
  try {
    await fn({ gw, scraper, seo, speech, auth: { authorization: `Bearer ${gw.token}` } });
  } finally {
    await gw.close();
    await Promise.all([scraper.close(), seo.close(), speech.close()]);
  }
}

/** Send a request line exactly as written (an HTTP client would normalise some of these). */
function rawRequest(s: Setup, method: string, target: string, extra = ''): Promise<string> {
  return raw(
    s.gw.port,
    `${method} ${target} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${s.gw.token}\r\nContent-Length: 0\r\nConnection: close\r\n${extra}\r\n`,
  );
}

test('each route reaches its own upstream with its own credential and the upstream host', async () => {
  await withSetup(async (s) => {
    const a = await request(`${s.gw.url}/scraper/v2/acts/a~b/runs?timeout=60`, { method: 'POST', headers: s.auth, body: '{}' });
    const b = await request(`${s.gw.url}/seo/v3/appendix/user_data`, { headers: s.auth });
    const c = await request(`${s.gw.url}/speech/v1/voices`, { headers: s.auth });
    assert.deepEqual([a.status, b.status, c.status], [200, 200, 200]);
    const [r1, r2, r3] = [s.scraper.requests, s.seo.requests, s.speech.requests];
    assert.equal(r1.length, 1);
    assert.equal(r2.length, 1);
    assert.equal(r3.length, 1);
    assert.equal(r1[0]?.method, 'POST');
    assert.equal(r1[0]?.url, '/v2/acts/a~b/runs?timeout=60');
    assert.equal(r1[0]?.headers.authorization, `Bearer ${s.gw.secrets.scraperToken}`);
    assert.equal(r1[0]?.headers.host, new URL(s.scraper.url).host);
    assert.equal(r2[0]?.url, '/v3/appendix/user_data');
    assert.equal(r2[0]?.headers.authorization, `Basic ${Buffer.from(`${s.gw.secrets.seoLogin}:${s.gw.secrets.seoPassword}`).toString('base64')}`);
    assert.equal(r3[0]?.url, '/v1/voices');
    assert.equal(r3[0]?.headers['xi-api-key'], s.gw.secrets.speechKey);
    assert.equal(r3[0]?.headers.authorization, undefined);
    // the upstream's answer comes back unchanged
    assert.deepEqual(c.json(), { ok: true, method: 'GET', url: '/v1/voices', bytes: 0 });
  });
});

test('a base URL path is kept as the upstream prefix', async () => {
  await withSetup(
    async (s) => {
      const r = await request(`${s.gw.url}/seo/v3/serp?x=1`, { headers: s.auth });
      assert.equal(r.status, 200);
      assert.equal(s.seo.requests[0]?.url, '/api/base/v3/serp?x=1');
    },
    (u) => ({ scraper: u.scraper.url, seo: `${u.seo.url}/api/base/`, speech: u.speech.url }),
  );
});

test('paths and queries reach the upstream byte for byte', async () => {
  await withSetup(async (s) => {
    const targets: Array<[string, string]> = [
      ['/seo/a%2Fb/c', '/a%2Fb/c'],
      ['/seo/%7Euser/%41%42', '/%7Euser/%41%42'],
      ['/seo/a//b///c', '/a//b///c'],
      ['/seo//lead', '//lead'],
      ['/seo/a\\b', '/a\\b'],
      ['/seo/{x}|y^`', '/{x}|y^`'],
      ['/seo/a;b=c/d', '/a;b=c/d'],
      ['/seo/x?b=2&a=1&b=1', '/x?b=2&a=1&b=1'],
      ['/seo/x?q=a%20b+c&e=%zz&&=&z&u=%E2%82%AC', '/x?q=a%20b+c&e=%zz&&=&z&u=%E2%82%AC'],
      ['/seo/x?j={"a":[1,2]}&s=\'q\'', '/x?j={"a":[1,2]}&s=\'q\''],
      ['/seo/x?a=1?b=2', '/x?a=1?b=2'],
      ['/seo/x?token=kept-on-this-route', '/x?token=kept-on-this-route'],
      ['/seo/a..b/.well-known/x', '/a..b/.well-known/x'],
    ];
    for (const [target] of targets) {
      const out = await rawRequest(s, 'GET', target);
      assert.match(out, /^HTTP\/1\.1 200 /, target);
    }
    assert.deepEqual(
      s.seo.requests.map((r) => r.url),
      targets.map(([, expected]) => expected),
    );
    // and that is what was on the wire, not just what the upstream's parser made of it
    const wire = s.seo.raw().toString('latin1');
    for (const [, expected] of targets) assert.ok(wire.includes(`GET ${expected} HTTP/1.1\r\n`), expected);
  });
});

test('credential query parameters are removed in every spelling, the rest kept as sent', async () => {
  await withSetup(async (s) => {
    await rawRequest(s, 'POST', '/scraper/v2/acts/x/runs?token=A&x=1&tok%65n=B&TOKEN=C&token&token[]=D&y=%2F&token=');
    await rawRequest(s, 'GET', '/speech/v1/voices?xi-api-key=A&v=1&xi%2Dapi%2Dkey=B&XI-API-KEY&w=2');
    await rawRequest(s, 'POST', '/scraper/v2/acts/x/runs?token=only');
    assert.deepEqual(
      s.scraper.requests.map((r) => r.url),
      ['/v2/acts/x/runs?x=1&y=%2F', '/v2/acts/x/runs'],
    );
    assert.equal(s.speech.requests[0]?.url, '/v1/voices?v=1&w=2');
  });
});

test('anything outside the route table is a 404 that never reaches an upstream', async () => {
  await withSetup(async (s) => {
    const cases: Array<[string, string]> = [
      ['GET', '/'],
      ['GET', '/other/x'],
      ['POST', '/scraperx/v2/acts'],
      ['GET', '/speech'],
      ['GET', '/speech/'],
      ['POST', '/scraper/?x=1'],
      ['GET', '/scraper/v2/acts'],
      ['PUT', '/scraper/v2/acts'],
      ['DELETE', '/seo/v3/x'],
      ['PUT', '/speech/v1/x'],
      ['HEAD', '/speech/v1/x'],
      ['OPTIONS', '/speech/v1/x'],
      ['OPTIONS', '*'],
      ['GET', 'http://127.0.0.1/seo/v3/x'],
    ];
    for (const [method, target] of cases) {
      const out = await rawRequest(s, method, target);
      assert.match(out, /^HTTP\/1\.1 404 /, `${method} ${target}`);
      assert.match(out, /content-type: application\/json/, `${method} ${target}`);
      if (method !== 'HEAD') assert.match(out, /"code":"not_found"/, `${method} ${target}`);
    }
    assert.equal(s.scraper.connections() + s.seo.connections() + s.speech.connections(), 0);
  });
});

test('dot-segments, literal or percent-encoded, are refused before any upstream sees them', async () => {
  await withSetup(async (s) => {
    for (const target of ['/seo/../speech/v1/x', '/seo/a/./b', '/seo/%2e%2E/x', '/seo/a/%2E', '/seo/a\\..\\b', '/seo/..;/admin', '/seo/a%2f..%2fb']) {
      const out = await rawRequest(s, 'GET', target);
      assert.match(out, /^HTTP\/1\.1 404 /, target);
      assert.match(out, /dot-segments/, target);
    }
    assert.equal(s.seo.connections() + s.speech.connections(), 0);
  });
});

test("method overrides cannot side-step a route's method list", async () => {
  await withSetup(async (s) => {
    const cases: Array<[string, string, string]> = [
      ['POST', '/scraper/v2/acts/x/runs?method=DELETE', ''],
      ['POST', '/scraper/v2/acts/x/runs?a=1&METH%4FD=DELETE', ''],
      ['POST', '/scraper/v2/acts/x/runs', 'X-HTTP-Method-Override: DELETE\r\n'],
      ['GET', '/seo/v3/x', 'X-HTTP-Method: PUT\r\n'],
      ['POST', '/speech/v1/x', 'X-Method-Override: PUT\r\n'],
    ];
    for (const [method, target, extra] of cases) {
      const out = await rawRequest(s, method, target, extra);
      assert.match(out, /^HTTP\/1\.1 404 /, target + extra);
      assert.match(out, /Method overrides/, target + extra);
    }
    assert.equal(s.scraper.connections() + s.seo.connections() + s.speech.connections(), 0);
  });
});

test('WebSocket upgrades and CONNECT are answered by the gateway, never proxied', async () => {
  await withSetup(async (s) => {
    const ws = (auth: string): Promise<string> =>
      raw(
        s.gw.port,
        `GET /speech/v1/convai/conversation HTTP/1.1\r\nHost: gw\r\n${auth}Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n`,
      );
    const authed = await ws(`Authorization: Bearer ${s.gw.token}\r\n`);
    assert.match(authed, /^HTTP\/1\.1 404 /);
    assert.match(authed, /\{"error":"WebSocket upgrades are not proxied.","code":"not_found"\}$/);
    const anonymous = await ws('');
    assert.match(anonymous, /^HTTP\/1\.1 401 /);
    assert.match(anonymous, /\{"error":"Unauthorized.","code":"unauthorized"\}$/);
    const connect = await raw(s.gw.port, `CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: 127.0.0.1:22\r\nAuthorization: Bearer ${s.gw.token}\r\n\r\n`);
    assert.match(connect, /^HTTP\/1\.1 404 /);
    assert.equal(s.speech.connections(), 0);
    const lines = s.gw.logs().filter((l) => l.msg === 'request completed');
    assert.deepEqual(
      lines.map((l) => l.status),
      [404, 401, 404],
    );
  });
});

test('a route without its credential answers 503 route_not_configured; the others keep working', async () => {
  await withSetup(
    async (s) => {
      const r = await request(`${s.gw.url}/speech/v1/voices`, { headers: s.auth });
      assert.equal(r.status, 503);
      assert.deepEqual(r.json(), { error: 'This route has no upstream credential configured.', code: 'route_not_configured' });
      assert.equal((await request(`${s.gw.url}/seo/v3/x`, { headers: s.auth })).status, 200);
      assert.equal(s.speech.connections(), 0);
    },
    (u) => ({ scraper: u.scraper.url, seo: u.seo.url, speech: u.speech.url, env: { KEYWARD_SPEECH_KEY: '' } }),
  );
});
