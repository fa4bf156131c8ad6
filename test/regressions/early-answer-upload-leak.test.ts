// An upstream that answers before the upload is complete, then a client that
// leaves: the upstream request must end too, or its socket stays open (and
// buffered) until the upstream itself gives up.
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

test('clients that leave mid-upload after an early answer leave no upstream connection behind', async () => {
  // Answers as soon as the head arrives, keeps the connection open, never reads the body's end.
  const up = await startRawUpstream(() => 'HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
  const gw = await startGateway({ speech: up.url });
  const N = 30;
  try {
    const clients = await Promise.all(
      Array.from(
        { length: N },
        () =>
          new Promise<net.Socket>((resolve, reject) => {
            const s = net.connect(gw.port, '127.0.0.1');
            let seen = '';
            s.on('error', reject);
            s.on('data', (d: Buffer) => {
              seen += d.toString('latin1');
              if (seen.includes('\r\n\r\nok')) resolve(s);
            });
            s.write(`POST /speech/v1/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\ncontent-length: 1000000\r\n\r\n`);
            s.write(Buffer.alloc(64 * 1024, 1));
          }),
      ),
    );
    await eventually(() => up.connections() === N, 5_000, 'every request reached the upstream');
    for (const c of clients) c.destroy();
    await eventually(() => up.open() === 0, 3_000, 'every upstream connection closed');
    assert.equal(up.connections(), N, 'one upstream connection per request, none reused mid-upload');
  } finally {
    await gw.close();
    await up.close();
  }
});
