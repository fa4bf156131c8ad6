// `Transfer-Encoding: gzip, chunked` from an upstream: Node's parser undoes
// the chunking and leaves the gzip on the body, which the egress filter then
// relayed unscanned. A transfer coding other than chunked is a 502 now
// (docs/security.md).
import assert from 'node:assert/strict';
import zlib from 'node:zlib';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

test('a transfer coding other than chunked is a 502; chunked alone is relayed', async () => {
  let token = '';
  const chunked = (body: Buffer): string => `${body.length.toString(16)}\r\n${body.toString('latin1')}\r\n0\r\n\r\n`;
  const up = await startRawUpstream((_head, i) => {
    if (i % 2 === 0) return `HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n${chunked(zlib.gzipSync(Buffer.from(`{"key":"${token}"}`)))}`;
    return `HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n${chunked(Buffer.from('{"ok":true}'))}`;
  });
  const gw = await startGateway({ speech: up.url });
  token = gw.secrets.speechKey;
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    const refused = await request(`${gw.url}/speech/v1/voices`, { headers: auth });
    assert.equal(refused.status, 502);
    assert.ok(!refused.body.includes(Buffer.from(token)));
    const fine = await request(`${gw.url}/speech/v1/voices`, { headers: auth });
    assert.equal(fine.status, 200);
    assert.equal(fine.body.toString(), '{"ok":true}');
    // Each request's line is written when its response closes, a moment after the client has the answer.
    await eventually(() => gw.logs().filter((l) => l.msg === 'request completed').length === 2, 5_000, 'both request lines');
    assert.equal(gw.logs().filter((l) => l.msg === 'request completed' && l.error === 'transfer_coding').length, 1);
  } finally {
    await gw.close();
    await up.close();
  }
});
