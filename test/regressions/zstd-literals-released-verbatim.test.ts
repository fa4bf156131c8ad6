// zstd released the secret verbatim: a streaming zstd decoder outputs
// nothing of a block until the block is whole, and a block may store short
// literals raw, so a compressed chunk holding the secret decoded to "nothing
// yet" and was released (Node's own zstdCompressSync of the speech user
// object, split just after the key: the key at the client, at 29 of 95 split
// positions). Compressed bytes are now released only up to the end of the
// last complete zstd block (docs/security.md). Checked at every split
// position of every coding: no byte of the key, raw or decoded, reaches the
// client.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import net from 'node:net';
import type { Transform } from 'node:stream';
import zlib from 'node:zlib';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { sampleSecrets, startGateway } from '../support/gateway.ts';

type Decoder = zlib.Zlib & Transform;
const CODINGS: ReadonlyArray<[string, (b: Buffer) => Buffer, () => Decoder]> = [
  ['zstd', (b) => zlib.zstdCompressSync(b), () => zlib.createZstdDecompress()],
  ['gzip', (b) => zlib.gzipSync(b), () => zlib.createGunzip()],
  ['deflate', (b) => zlib.deflateSync(b), () => zlib.createInflate()],
  ['br', (b) => zlib.brotliCompressSync(b), () => zlib.createBrotliDecompress()],
];

/** What a client's decoder makes of the bytes it got, up to where they stop making sense. */
function decodeWhatArrived(body: Buffer, decoder: Decoder): Promise<Buffer> {
  return new Promise((resolve) => {
    const out: Buffer[] = [];
    decoder.on('data', (d: Buffer) => out.push(d));
    const done = (): void => resolve(Buffer.concat(out));
    decoder.on('error', done);
    decoder.on('end', done);
    decoder.write(body);
    decoder.flush(() => {
      done();
      decoder.destroy();
    });
  });
}

test('no split of a compressed body lets any byte of the key reach the client, raw or decoded, for every coding', async () => {
  let parts: Buffer[] = [];
  let coding = '';
  const up = net.createServer((socket) => {
    socket.setNoDelay(true);
    socket.once('data', () => {
      const total = parts.reduce((n, p) => n + p.length, 0);
      socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: ${coding}\r\ncontent-length: ${total}\r\nconnection: close\r\n\r\n`);
      // The two parts a moment apart, so the gateway reads them as two chunks.
      socket.write(parts[0] as Buffer, () => setTimeout(() => socket.end(parts[1] as Buffer), 5));
    });
    socket.on('error', () => socket.destroy());
  });
  await new Promise<void>((r) => up.listen(0, '127.0.0.1', r));
  // Repeats make the short body a compressed block whose few literals, the key among them, are stored raw;
  // the long one has enough text that zstd codes its literals with Huffman, the key never verbatim.
  // zstd decides per input: a key of the real shape is drawn until both hold (nearly always the first).
  const words = 'the quick brown fox jumps over the lazy dog while voices speak softly in a studio near the river bank '.repeat(3);
  const shortOf = (k: string): Buffer => Buffer.from(`{"xi_api_key":"${k}","voices":[{"voice_id":"v1"},{"voice_id":"v2"},{"voice_id":"v3"}]}`);
  const longOf = (k: string): Buffer =>
    Buffer.from(`{"description":"${words}","xi_api_key":"${k}","subscription":{"tier":"creator","note":"${words.slice(0, 120)}"}}`);
  const level19 = { params: { [zlib.constants.ZSTD_c_compressionLevel]: 19 } };
  let key = '';
  for (let i = 0; i < 100 && key === ''; i++) {
    const k = `sk_${randomBytes(24).toString('base64url')}`;
    const v = zlib.zstdCompressSync(shortOf(k));
    const h = zlib.zstdCompressSync(longOf(k), level19);
    if (v.includes(Buffer.from(k)) && v.length < shortOf(k).length && !h.includes(Buffer.from(k.slice(0, 8)))) key = k;
  }
  assert.notEqual(key, '', 'a key zstd stores verbatim in one body and Huffman-codes in the other');
  const gw = await startGateway({
    speech: `http://127.0.0.1:${(up.address() as net.AddressInfo).port}`,
    secrets: { ...sampleSecrets(), speech: [key] },
  });
  try {
    const short = shortOf(key);
    const huffman = zlib.zstdCompressSync(longOf(key), level19);
    const bodies: Array<[string, Buffer, () => Decoder]> = [
      ...CODINGS.map(([name, compress, decoder]): [string, Buffer, () => Decoder] => [name, compress(short), decoder]),
      ['zstd', huffman, (CODINGS[0] as (typeof CODINGS)[0])[2]],
    ];
    let cuts = 0;
    for (const [name, body, decoder] of bodies) {
      for (let at = 1; at < body.length; at++) {
        coding = name;
        parts = [body.subarray(0, at), body.subarray(at)];
        const reply = Buffer.from(
          await raw(
            gw.port,
            `GET /speech/v1/user HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\naccept-encoding: ${name}\r\nconnection: close\r\n\r\n`,
            { timeoutMs: 5_000 },
          ),
          'latin1',
        );
        const split = `${name} split at ${at} of ${body.length}`;
        assert.ok(!reply.includes(Buffer.from(key.slice(0, 8))), `${split}: raw key bytes at the client`);
        const headEnd = reply.indexOf('\r\n\r\n');
        if (headEnd < 0) continue;
        assert.match(reply.subarray(0, headEnd).toString('latin1'), /^HTTP\/1\.1 200 /, split);
        const decoded = await decodeWhatArrived(reply.subarray(headEnd + 4), decoder());
        assert.ok(!decoded.includes(Buffer.from(key.slice(0, 4))), `${split}: decoded key bytes at the client: ${decoded.toString('latin1')}`);
        assert.ok(reply.length - headEnd - 4 < body.length, `${split}: the whole body went`);
        cuts++;
      }
    }
    assert.ok(cuts > 0, 'some responses began before the cut');
  } finally {
    await gw.close();
    up.close();
  }
});
