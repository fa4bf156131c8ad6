// A complete response dropped: a `200` with Content-Length followed by stray
// bytes reached the client as 0 bytes and a closed connection, though the
// upstream had billed the call (Node's parser took the stray bytes for a next
// response and failed the request). The complete response is now relayed and
// the client's connection closed after it; the upstream connection is never
// pooled again (docs/security.md, "Upstream connections").
import assert from 'node:assert/strict';
import zlib from 'node:zlib';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

test('a complete response followed by stray bytes reaches the client whole, then the connection closes', async () => {
  const json = Buffer.from('{"data":{"id":"run1","status":"READY"}}');
  const gzipped = zlib.gzipSync(json);
  let variant = 0;
  const up = await startRawUpstream(() => {
    const [body, extra] = variant === 0 ? [json, ''] : [gzipped, 'content-encoding: gzip\r\n'];
    return Buffer.concat([
      Buffer.from(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n${extra}content-length: ${body.length}\r\n\r\n`),
      body,
      Buffer.from('STRAY BYTES, NOT HTTP\r\n\r\n'),
    ]);
  });
  const gw = await startGateway({ scraper: up.url });
  try {
    for (variant = 0; variant < 2; variant++) {
      const req = `POST /scraper/v2/acts/x/runs HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\ncontent-length: 0\r\n\r\n`;
      // Two pipelined requests: the first is answered whole, and the connection closes after it.
      const out = Buffer.from(await raw(gw.port, req + req, { timeoutMs: 5_000 }), 'latin1');
      const head = out.subarray(0, out.indexOf('\r\n\r\n')).toString('latin1');
      assert.match(head, /^HTTP\/1\.1 200 /, `variant ${variant}: ${out.toString('latin1')}`);
      assert.match(head, /connection: close/i, `variant ${variant}: the client is told the connection closes`);
      const body = out.subarray(out.indexOf('\r\n\r\n') + 4);
      assert.deepEqual(variant === 0 ? body : zlib.gunzipSync(body), json, `variant ${variant}: the complete body`);
      assert.equal(out.toString('latin1').split('HTTP/1.1 ').length - 1, 1, 'one response, then the connection closed');
      assert.ok(!out.includes('STRAY'));
    }
    await eventually(() => gw.logs().filter((l) => l.msg === 'request completed' && l.status === 200).length >= 2, 5_000, 'logged as 200s');
  } finally {
    await gw.close();
    await up.close();
  }
});
