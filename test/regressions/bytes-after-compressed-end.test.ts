// Bytes after the end of a compressed stream were relayed unscanned: the
// decoders stop at the end of their data and drop what follows, so
// `deflate('hello ') + "apify_api_…"` reached the client with the token in
// clear. A decoder that ends before consuming all it was given now cuts the
// response before any of those bytes go (docs/security.md), logged with
// `trailing_bytes` and counted.
import assert from 'node:assert/strict';
import zlib from 'node:zlib';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import net from 'node:net';

const CODINGS: ReadonlyArray<[string, (b: Buffer) => Buffer]> = [
  ['deflate', (b) => zlib.deflateSync(b)],
  ['gzip', (b) => Buffer.concat([zlib.gzipSync(b), Buffer.alloc(10)])],
  ['br', (b) => zlib.brotliCompressSync(b)],
  ['zstd', (b) => zlib.zstdCompressSync(b)],
];

test('a secret after the end of the compressed data never reaches the client, for every coding', async () => {
  let compressed: Buffer = Buffer.alloc(0);
  let after: Buffer = Buffer.alloc(0);
  let coding = '';
  // The compressed data in one write, what follows it in another a moment later.
  const up = net.createServer((socket) => {
    socket.once('data', () => {
      socket.write(
        `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: ${coding}\r\ncontent-length: ${compressed.length + after.length}\r\nconnection: close\r\n\r\n`,
      );
      socket.write(compressed);
      setTimeout(() => socket.end(after), 50);
    });
    socket.on('error', () => socket.destroy());
  });
  await new Promise<void>((r) => up.listen(0, '127.0.0.1', r));
  const gw = await startGateway({ speech: `http://127.0.0.1:${(up.address() as net.AddressInfo).port}` });
  try {
    const token = gw.secrets.speechKey;
    // The secret itself, and bytes that are no secret: neither is ever decoded, so neither may go.
    const junk = 'not-compressed-and-never-decoded';
    for (const trailing of [token, junk]) {
      for (const [name, compress] of CODINGS) {
        coding = name;
        compressed = compress(Buffer.from('{"hello":"world"}'));
        after = Buffer.from(trailing);
        const out = await raw(
          gw.port,
          `GET /speech/v1/voices HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\naccept-encoding: ${name}\r\nconnection: close\r\n\r\n`,
          { timeoutMs: 5_000 },
        );
        assert.ok(!Buffer.from(out, 'latin1').includes(Buffer.from(trailing.slice(0, 12))), `${name}: bytes after the compressed data reached the client`);
      }
    }
    // Each request's line is written when its response closes, a moment after the client has the answer.
    await eventually(() => gw.logs().filter((l) => l.msg === 'request completed').length === 2 * CODINGS.length, 5_000, 'every request line');
    const errors = gw
      .logs()
      .filter((l) => l.msg === 'request completed')
      .map((l) => l.error);
    // The secret is also caught in the raw bytes (secret_in_compressed_body); the rest as trailing bytes.
    assert.ok(
      errors.slice(0, 4).every((e) => e === 'secret_in_compressed_body' || e === 'trailing_bytes'),
      JSON.stringify(errors),
    );
    assert.ok(errors.slice(4).filter((e) => e === 'trailing_bytes').length >= 3, `logged as trailing_bytes: ${JSON.stringify(errors)}`);
  } finally {
    await gw.close();
    up.close();
  }
});
