// docs/authentication.md as a property: for every route and every kind of request, the
// client token is absent from every byte an upstream receives, the upstream
// credential is always the gateway's, and no secret leaks back or into logs.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';
import { generateToken } from '../../src/keys/token.ts';
import { raw, request, statusLines, type Reply } from '../support/client.ts';
import { deadline } from '../support/deadline.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

interface Case {
  readonly route: 'scraper' | 'seo' | 'speech';
  readonly method: string;
  readonly path: string;
}

const CASES: readonly Case[] = [
  { route: 'scraper', method: 'POST', path: '/scraper/v2/acts/a~b/runs?timeout=60' },
  { route: 'seo', method: 'GET', path: '/seo/v3/appendix/user_data' },
  { route: 'seo', method: 'POST', path: '/seo/v3/serp/google/organic/live/advanced' },
  { route: 'speech', method: 'GET', path: '/speech/v1/voices' },
  { route: 'speech', method: 'POST', path: '/speech/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM' },
  { route: 'speech', method: 'PATCH', path: '/speech/v1/voices/x/settings' },
  { route: 'speech', method: 'DELETE', path: '/speech/v1/history/item1' },
];

function credentialOf(gw: TestGateway, route: Case['route']): string {
  const s = gw.secrets;
  if (route === 'scraper') return `authorization: Bearer ${s.scraperToken}`;
  if (route === 'seo') return `authorization: Basic ${Buffer.from(`${s.seoLogin}:${s.seoPassword}`).toString('base64')}`;
  return `xi-api-key: ${s.speechKey}`;
}

/** The client token in every place a careless client might put it, besides Authorization. */
function leakyHeaders(token: string): http.OutgoingHttpHeaders {
  return {
    authorization: `Bearer ${token}`,
    'proxy-authorization': `Bearer ${token}`,
    'x-api-key': token,
    cookie: `session=${token}`,
    'xi-api-key': token,
  };
}

function send(
  url: string,
  method: string,
  headers: http.OutgoingHttpHeaders,
  body: Buffer,
  mode: 'plain' | 'chunked' | 'expect',
  agent: http.Agent | false = false,
): Promise<Reply> {
  const done = new Promise<Reply>((resolve, reject) => {
    const h: http.OutgoingHttpHeaders = { ...headers };
    if (mode === 'chunked') h['transfer-encoding'] = 'chunked';
    else h['content-length'] = body.length;
    if (mode === 'expect') h.expect = '100-continue';
    const req = http.request(url, { method, headers: h, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () =>
        resolve({ status: res.statusCode as number, headers: res.headers, rawHeaders: res.rawHeaders, body: Buffer.concat(chunks), json: () => null }),
      );
    });
    req.on('error', reject);
    if (mode === 'expect') req.on('continue', () => req.end(body));
    else if (mode === 'chunked') {
      req.write(body.subarray(0, 10));
      setImmediate(() => req.end(body.subarray(10)));
    } else req.end(body);
  });
  return deadline(done, 10_000, `${mode} ${method} ${url}`);
}

for (const c of CASES) {
  test(`client token never reaches the ${c.route} upstream: ${c.method} plain, chunked, 100-continue, pipelined, keep-alive`, async () => {
    const upstream = await startUpstream();
    const gw = await startGateway({ [c.route]: upstream.url });
    const replies: Reply[] = [];
    const rawReplies: string[] = [];
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    try {
      const url = `${gw.url}${c.path}`;
      const headers = leakyHeaders(gw.token);
      // A body that mentions neither secret nor token: anything found upstream came from headers or URL.
      const body = Buffer.from(JSON.stringify([{ text: 'hello', keyword: 'weather' }]).padEnd(2048, ' '));
      replies.push(await send(url, c.method, headers, body, 'plain'));
      replies.push(await send(url, c.method, headers, body, 'chunked'));
      replies.push(await send(url, c.method, headers, Buffer.alloc(2 * 1024 * 1024, 'a'), 'expect'));
      for (let i = 0; i < 3; i++) replies.push(await send(url, c.method, headers, body, 'plain', agent));
      const one = `${c.method} ${c.path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${gw.token}\r\nX-Api-Key: ${gw.token}\r\nContent-Length: 5\r\n\r\nhello`;
      const chunked = `${c.method} ${c.path} HTTP/1.1\r\nHost: gw\r\nAuthorization: bearer ${gw.token}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n`;
      const pipelined = await raw(gw.port, one + chunked + one.replace('HTTP/1.1\r\n', 'HTTP/1.1\r\nConnection: close\r\n'));
      rawReplies.push(pipelined);
      assert.deepEqual(
        statusLines(pipelined).map((l) => l.slice(9, 12)),
        ['200', '200', '200'],
      );

      for (const r of replies) assert.equal(r.status, 200);
      assert.equal(upstream.requests.length, 9);
      for (const r of upstream.requests) assert.equal(r.method, c.method);
      assert.equal(upstream.requests[2]?.body.length, 2 * 1024 * 1024, 'the 100-continue upload arrived whole');
      assert.equal(upstream.requests[2]?.headers.expect, undefined, 'the gateway answered Expect itself');
      for (const r of upstream.requests.slice(1, 2)) assert.equal(r.body.length, body.length, 'the chunked body arrived whole');

      const wire = upstream.raw().toString('latin1');
      assert.equal(wire.includes(gw.token), false, 'client token reached the upstream');
      assert.equal(wire.split(credentialOf(gw, c.route)).length - 1, 9, 'every request carried the upstream credential exactly once');
      assert.equal(wire.toLowerCase().includes('proxy-authorization'), false);

      const secrets = Object.values(gw.secrets).filter((v) => !v.startsWith('seologin'));
      const back = [...replies.map((r) => `${r.rawHeaders.join('\n')}\n${r.body.toString('latin1')}`), ...rawReplies].join('\n');
      const logs = gw.logText();
      for (const secret of [...secrets, Buffer.from(`${gw.secrets.seoLogin}:${gw.secrets.seoPassword}`).toString('base64')]) {
        assert.equal(back.includes(secret), false, 'an upstream secret reached the client');
        assert.equal(logs.includes(secret), false, 'an upstream secret reached the logs');
      }
      assert.equal(logs.includes(gw.token), false, 'the client token reached the logs');
    } finally {
      agent.destroy();
      await gw.close();
      await upstream.close();
    }
  });
}

test('a client token in the URL, in any encoding or case, is refused, not forwarded, and not logged', async () => {
  const upstream = await startUpstream();
  const gw = await startGateway({ seo: upstream.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    const encoded = `%6B%77%5F${gw.token.slice(3)}`;
    const other = generateToken();
    const urls = [
      `/seo/v3/x?api_key=${gw.token}`,
      `/seo/v3/${gw.token}/x`,
      `/seo/v3/x?k=${encoded}`,
      `/seo/v3/${encoded}/x`,
      `/seo/v3/x?k=${gw.token.toLowerCase()}`,
      `/seo/v3/x?k=${other}`,
      `/seo/v3/x?k=kw%5F${gw.token.slice(3, 40)}`,
    ];
    for (const url of urls) {
      const r = await request(`${gw.url}${url}`, { headers: auth });
      assert.equal(r.status, 400, url);
      assert.deepEqual(r.json(), { error: 'A client token must not appear in the URL.', code: 'bad_request' });
    }
    assert.equal(upstream.connections(), 0);
    const text = gw.logText();
    for (const leak of [gw.token, gw.token.slice(3), gw.token.toLowerCase(), gw.token.slice(3).toLowerCase(), other.slice(3)])
      assert.equal(text.includes(leak), false);
    assert.equal(text.split('kw_[redacted]').length - 1, urls.length);
  } finally {
    await gw.close();
    await upstream.close();
  }
});

test("the scraper's own credential parameter carrying the client token is dropped and the request forwarded (docs/routes.md)", async () => {
  const upstream = await startUpstream();
  const gw = await startGateway({ scraper: upstream.url, speech: upstream.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    const r = await request(`${gw.url}/scraper/v2/acts/x/runs?token=${gw.token}&build=latest`, { method: 'POST', headers: auth });
    assert.equal(r.status, 200);
    const s = await request(`${gw.url}/speech/v1/voices?xi-api-key=${gw.token}&page=2`, { headers: auth });
    assert.equal(s.status, 200);
    assert.deepEqual(
      upstream.requests.map((q) => q.url),
      ['/v2/acts/x/runs?build=latest', '/v1/voices?page=2'],
    );
    assert.equal(upstream.raw().includes(gw.token), false);
    assert.equal(gw.logText().includes(gw.token), false);
  } finally {
    await gw.close();
    await upstream.close();
  }
});
