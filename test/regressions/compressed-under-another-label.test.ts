// Compressed bytes under another label: a gzip body sent as
// `Content-Encoding: identity` or with no coding at all (`application/gzip`)
// reached the client unscanned, and many clients decode it (a saved `.gz`, a
// lenient library). Bodies are now sniffed by their magic bytes (gzip,
// zlib, zstd) whatever the labels and scanned decoded; one that only looks
// compressed (text that begins `x^`) is relayed whole as the plain body it
// is (docs/security.md, "Compressed bodies").
import assert from 'node:assert/strict';
import zlib from 'node:zlib';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

test('a compressed body under another label is scanned decoded; a plain one that only looks compressed passes whole', async () => {
  let body: Buffer = Buffer.alloc(0);
  let headers = '';
  const up = await startRawUpstream(() => Buffer.concat([Buffer.from(`HTTP/1.1 200 OK\r\n${headers}content-length: ${body.length}\r\n\r\n`), body]));
  const gw = await startGateway({ speech: up.url });
  try {
    const key = gw.secrets.speechKey;
    const json = Buffer.from(`{"xi_api_key":"${key}","voices":[{"voice_id":"v1"},{"voice_id":"v2"}]}`);
    const cases: Array<[string, string, Buffer]> = [
      ['gzip labelled identity', 'content-type: application/json\r\ncontent-encoding: identity\r\n', zlib.gzipSync(json)],
      ['gzip unlabelled', 'content-type: application/gzip\r\n', zlib.gzipSync(json)],
      ['zlib unlabelled', 'content-type: application/octet-stream\r\n', zlib.deflateSync(json)],
      ['zstd unlabelled', 'content-type: application/octet-stream\r\n', zlib.zstdCompressSync(json)],
    ];
    const decoders = [zlib.gunzipSync, zlib.inflateSync, zlib.zstdDecompressSync];
    for (const [name, h, b] of cases) {
      headers = h;
      body = b;
      const r = await request(`${gw.url}/speech/v1/user`, { headers: { authorization: `Bearer ${gw.token}` } }).catch(() => null);
      const got = r?.body ?? Buffer.alloc(0);
      assert.ok(!got.includes(Buffer.from(key)), `${name}: raw`);
      for (const d of decoders) {
        let decoded = Buffer.alloc(0);
        try {
          decoded = d(got, { finishFlush: zlib.constants.Z_SYNC_FLUSH });
        } catch {
          // Not this coding, or cut: what decodes is checked below when it does.
        }
        assert.ok(!decoded.includes(Buffer.from(key.slice(0, 6))), `${name}: decoded`);
      }
    }
    // Unlabelled gzip that holds a secret's start, then more than 1 MiB of empty blocks, then the rest: cut, never relayed plain.
    headers = 'content-type: application/octet-stream\r\n';
    const start = zlib.gzipSync(`hello ${key.slice(0, 6)}`, { finishFlush: zlib.constants.Z_SYNC_FLUSH });
    const rest = zlib.deflateRawSync(`${key.slice(6)} bye`);
    body = Buffer.concat([start, Buffer.from('000000ffff'.repeat(230_000), 'hex'), rest]);
    const held = await request(`${gw.url}/speech/v1/user`, { headers: { authorization: `Bearer ${gw.token}` } }).catch(() => null);
    const heldBody = held?.body ?? Buffer.alloc(0);
    let heldDecoded = Buffer.alloc(0);
    try {
      heldDecoded = zlib.gunzipSync(heldBody, { finishFlush: zlib.constants.Z_SYNC_FLUSH });
    } catch {
      // cut
    }
    assert.ok(heldBody.length < body.length, 'not relayed whole');
    assert.ok(!heldDecoded.includes(Buffer.from(key.slice(0, 6))), 'the secret start never decodes at the client');
    // Text whose first two bytes are a valid zlib header ("x^"): not compressed, relayed whole.
    headers = 'content-type: text/plain\r\n';
    body = Buffer.from('x^2 + y^2 = r^2, the circle; nothing here is compressed at all.');
    const plain = await request(`${gw.url}/speech/v1/notes`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(plain.status, 200);
    assert.deepEqual(plain.body, body);
    // And a plain body that begins that way and carries the key: masked like any plain body.
    body = Buffer.from(`x^ echo ${key} end`);
    const masked = await request(`${gw.url}/speech/v1/notes`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(masked.body.toString(), `x^ echo ${'*'.repeat(key.length)} end`);
  } finally {
    await gw.close();
    await up.close();
  }
});
