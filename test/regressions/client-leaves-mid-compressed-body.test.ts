// Work an upstream could go on forcing after the client left: ten minutes
// after every client of a stacked-codings response had gone, the gateway
// still ran at a full core with two upstream sockets open. A client that
// leaves now stops every decoder and the upstream response at once
// (docs/security.md, "Work an upstream can force on the gateway").
import assert from 'node:assert/strict';
import net from 'node:net';
import zlib from 'node:zlib';
import { test } from 'node:test';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

test('a client that leaves mid compressed body closes the upstream connection at once', async () => {
  // Three codings, the first part of the body only: the upstream never ends it.
  const body = zlib.gzipSync(zlib.deflateSync(zlib.gzipSync(Buffer.from('{"items":['.padEnd(200_000, '{"a":1},')))));
  const part = body.subarray(0, Math.floor(body.length / 2));
  const up = await startRawUpstream(() =>
    Buffer.concat([
      Buffer.from(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip, deflate, gzip\r\ncontent-length: ${body.length}\r\n\r\n`),
      part,
    ]),
  );
  const gw = await startGateway({ speech: up.url });
  try {
    for (let i = 0; i < 3; i++) {
      const client = net.connect(gw.port, '127.0.0.1');
      client.write(`GET /speech/v1/history HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\naccept-encoding: gzip, deflate\r\n\r\n`);
      // The head and some body arrived: the response is under way.
      await new Promise<void>((resolve) => client.once('data', () => resolve()));
      await eventually(() => up.open() === 1, 5_000, 'the upstream connection open while the client reads');
      client.destroy();
      await eventually(() => up.open() === 0, 5_000, 'the upstream connection closed after the client left');
    }
    await eventually(() => gw.logs().filter((l) => l.msg === 'request completed' && l.aborted === true).length === 3, 5_000, 'three aborted requests logged');
    assert.equal(up.connections(), 3);
  } finally {
    await gw.close();
    await up.close();
  }
});
