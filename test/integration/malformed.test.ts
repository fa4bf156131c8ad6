// A raw-socket corpus of malformed and unusual HTTP (docs/responses.md): every entry
// gets a 4xx (JSON wherever Node lets the gateway write the answer), nothing
// reaches an upstream, and the process keeps serving.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw, request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('malformed requests get a 4xx, never reach an upstream, and never stop the gateway', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, speech: up.url, scraper: up.url });
  try {
    const auth = `authorization: Bearer ${gw.token}\r\n`;
    const corpus: Array<[name: string, bytes: string | Buffer, status: number]> = [
      ['space in a header name', `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}x bad: 1\r\n\r\n`, 400],
      ['NUL in a header value', `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}x-a: a\x00b\r\n\r\n`, 400],
      ['control character in the target', `GET /seo/v3/\x01x HTTP/1.1\r\nhost: x\r\n${auth}\r\n`, 400],
      ['space in the target', `GET /seo/v3/a b HTTP/1.1\r\nhost: x\r\n${auth}\r\n`, 400],
      ['conflicting Content-Length', `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}content-length: 5\r\ncontent-length: 6\r\n\r\nhello!`, 400],
      ['repeated Content-Length', `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}content-length: 5\r\ncontent-length: 5\r\n\r\nhello`, 400],
      ['Content-Length list', `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}content-length: 5, 5\r\n\r\nhello`, 400],
      ['negative Content-Length', `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}content-length: -1\r\n\r\n`, 400],
      [
        'Content-Length with Transfer-Encoding',
        `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}content-length: 5\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n`,
        400,
      ],
      ['Transfer-Encoding other than chunked', `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}transfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n`, 400],
      ['bad chunk size', `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}transfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n`, 400],
      ['obs-fold', `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}x-a: b\r\n c\r\n\r\n`, 400],
      ['bare LF line ends', `GET /seo/v3/x HTTP/1.1\nhost: x\n${auth.replace('\r\n', '\n')}\n`, 400],
      ['bare CR', `GET /seo/v3/x HTTP/1.1\rhost: x\r\n${auth}\r\n`, 400],
      [
        'non-ASCII header name',
        Buffer.concat([Buffer.from(`GET /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}x-`), Buffer.from([0xc3, 0xa9]), Buffer.from(': 1\r\n\r\n')]),
        400,
      ],
      [
        'non-ASCII header value without a token',
        Buffer.concat([Buffer.from('GET /seo/v3/x HTTP/1.1\r\nhost: x\r\nx-a: '), Buffer.from([0xc3, 0xa9]), Buffer.from('\r\n\r\n')]),
        401,
      ],
      ['oversized headers', `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}x-pad: ${'a'.repeat(20_000)}\r\n\r\n`, 431],
      ['absolute-form target', `GET http://127.0.0.1/seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}\r\n`, 404],
      ['asterisk-form target', `OPTIONS * HTTP/1.1\r\nhost: x\r\n${auth}\r\n`, 404],
      ['authority-form CONNECT', `CONNECT 127.0.0.1:443 HTTP/1.1\r\nhost: x\r\n${auth}\r\n`, 404],
      ['unknown HTTP version', `GET /seo/v3/x HTTP/3.0\r\nhost: x\r\n${auth}\r\n`, 400],
      ['garbage', '\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03', 400],
      ['HTTP/1.0 without a token', 'GET /seo/v3/x HTTP/1.0\r\n\r\n', 401],
      ['HTTP/1.0 keep-alive without a token', 'GET /seo/v3/x HTTP/1.0\r\nconnection: keep-alive\r\n\r\n', 401],
      ['HTTP/1.0 to an unknown route', `GET /nowhere/x HTTP/1.0\r\n${auth}\r\n`, 404],
    ];
    for (const [name, bytes, status] of corpus) {
      const received = await raw(gw.port, bytes, { until: (r) => /\r\n\r\n[\s\S]*\}$/.test(r), timeoutMs: 5_000 });
      assert.match(received, new RegExp(`^HTTP/1\\.[01] ${status} `), `${name}: ${JSON.stringify(received.slice(0, 200))}`);
      assert.match(received, /content-type: application\/json/i, `${name}: JSON answer`);
      assert.match(received, /\r\n\r\n\{"error":"[^"]+","code":"[a-z_]+"\}$/, `${name}: catalogue body`);
    }
    assert.equal(up.requests.length, 0, 'nothing reached an upstream');
    // HTTP/1.0 keep-alive is honoured: two answers on one connection.
    const both = await raw(gw.port, 'GET /seo/v3/x HTTP/1.0\r\nconnection: keep-alive\r\n\r\nGET /seo/v3/x HTTP/1.0\r\n\r\n');
    assert.equal(both.match(/HTTP\/1\.1 401 /g)?.length, 2);
    const ok = await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(ok.status, 200, 'still serving');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('an upstream whose name does not resolve is 502 upstream_unreachable, logged with the DNS error', async () => {
  const gw = await startGateway({ speech: 'http://upstream.invalid' });
  try {
    const r = await request(`${gw.url}/speech/v1/voices`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(r.status, 502);
    assert.deepEqual(r.json(), { error: 'Upstream unreachable.', code: 'upstream_unreachable' });
    const line = gw.logs().find((l) => l.msg === 'request completed');
    assert.match(String(line?.error), /^(ENOTFOUND|EAI_AGAIN)$/);
  } finally {
    await gw.close();
  }
});
