// RFC 9110 §7.6.1: connection-specific headers stop at the gateway, both ways.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('hop-by-hop request headers, and the ones Connection names, do not reach the upstream', async () => {
  const upstream = await startUpstream();
  const gw = await startGateway({ seo: upstream.url });
  try {
    const out = await raw(
      gw.port,
      'GET /seo/v3/x HTTP/1.1\r\nHost: gw\r\n' +
        `Authorization: Bearer ${gw.token}\r\n` +
        'Connection: keep-alive, X-Hop-A, x-hop-b\r\nX-Hop-A: 1\r\nX-Hop-B: 2\r\nKeep-Alive: timeout=9\r\n' +
        'Proxy-Connection: keep-alive\r\nTE: trailers\r\nTrailer: X-T\r\nUpgrade: h2c\r\nProxy-Authorization: Basic Zm9vOmJhcg==\r\n' +
        'X-End-To-End: kept\r\nAccept: application/json\r\n\r\n',
      { until: (s) => s.includes('"ok":true') },
    );
    assert.match(out, /^HTTP\/1\.1 200 /);
    const got = upstream.requests[0]?.headers ?? {};
    for (const h of ['x-hop-a', 'x-hop-b', 'keep-alive', 'proxy-connection', 'te', 'trailer', 'upgrade', 'proxy-authorization']) {
      assert.equal(got[h], undefined, h);
    }
    assert.equal(got['x-end-to-end'], 'kept');
    assert.equal(got.accept, 'application/json');
    assert.doesNotMatch(upstream.raw().toString('latin1'), /timeout=9|x-hop|h2c|Zm9vOmJhcg/i);
  } finally {
    await gw.close();
    await upstream.close();
  }
});

test('hop-by-hop response headers stop at the gateway; repeated end-to-end ones pass intact', async () => {
  const upstream = await startUpstream((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(201, 'Made It', [
        'Content-Type',
        'application/json',
        'Set-Cookie',
        'a=1; Path=/',
        'Set-Cookie',
        'b=2; Path=/',
        'Connection',
        'keep-alive, X-Private',
        'X-Private',
        'internal',
        'Keep-Alive',
        'timeout=77',
        'Proxy-Connection',
        'keep-alive',
        'Trailer',
        'X-Checksum',
        'Upgrade',
        'h2c',
        'X-Provider-Request',
        'abc123',
      ]);
      res.end('{"made":true}');
    });
  });
  const gw = await startGateway({ scraper: upstream.url });
  try {
    const out = await raw(
      gw.port,
      `POST /scraper/v2/acts/x/runs HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${gw.token}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`,
    );
    const [head, body] = out.split('\r\n\r\n');
    // The status's standard phrase, never the upstream's own (docs/security.md): free text could carry a secret.
    assert.match(head ?? '', /^HTTP\/1\.1 201 Created\r\n/);
    assert.match(head ?? '', /\r\nSet-Cookie: a=1; Path=\/\r\n/);
    assert.match(head ?? '', /\r\nSet-Cookie: b=2; Path=\/\r\n/);
    assert.match(head ?? '', /\r\nX-Provider-Request: abc123\r\n/);
    assert.doesNotMatch(head ?? '', /X-Private|timeout=77|Proxy-Connection|Trailer|Upgrade|h2c/i);
    assert.ok(body?.includes('{"made":true}'));
  } finally {
    await gw.close();
    await upstream.close();
  }
});
