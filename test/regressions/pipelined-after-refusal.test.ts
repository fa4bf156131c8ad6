// Once the gateway has decided to close a connection (a refusal with an
// unread body), nothing more from it is forwarded: the client only ever sees
// the refusal, so a pipelined request behind it must not reach (and be billed
// by) an upstream.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw, statusLines } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('a request pipelined behind a refused request with a body is never forwarded', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  try {
    const good = `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\n\r\n`;
    const cases = [
      // unauthenticated, with a body
      `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello`,
      // authenticated, refused route, with a body
      `POST /nowhere/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\ncontent-length: 5\r\n\r\nhello`,
      // declared body over the limit is not the case here; a method override with a body:
      `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nx-http-method-override: DELETE\r\ncontent-length: 5\r\n\r\nhello`,
    ];
    for (const first of cases) {
      const received = await raw(gw.port, first + good + good);
      const lines = statusLines(received);
      assert.equal(lines.length, 1, received);
      assert.match(received, /connection: close/i);
    }
    assert.equal(up.requests.length, 0, 'nothing reached the upstream');
    const closing = gw.logs().filter((l) => l.error === 'connection_closing');
    assert.ok(closing.length >= cases.length, 'the dropped requests are logged');
  } finally {
    await gw.close();
    await up.close();
  }
});
