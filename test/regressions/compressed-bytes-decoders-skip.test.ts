// Bytes the decoders skip or hold back reached clients unscanned: the gzip
// header's FNAME, FCOMMENT and FEXTRA fields, zstd skippable frames, and
// zstd literals stored raw in a block whose decoded output the streaming
// decoder had not given yet. The compressed bytes are now scanned as they
// are too, and a secret in them cuts the response (docs/security.md).
import assert from 'node:assert/strict';
import net from 'node:net';
import zlib from 'node:zlib';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';

/** A gzip member whose header carries `field` as FNAME (flag 0x08) or FCOMMENT (0x10), around a clean body. */
function gzipWithHeaderField(flag: 0x08 | 0x10, field: string, body: Buffer): Buffer {
  const plain = zlib.gzipSync(body);
  const header = Buffer.from(plain.subarray(0, 10));
  header[3] = flag;
  return Buffer.concat([header, Buffer.from(`${field}\0`, 'latin1'), plain.subarray(10)]);
}

/** gzip FEXTRA (flag 0x04): two length bytes, then the field. */
function gzipWithExtra(field: string, body: Buffer): Buffer {
  const plain = zlib.gzipSync(body);
  const header = Buffer.from(plain.subarray(0, 10));
  header[3] = 0x04;
  const len = Buffer.alloc(2);
  len.writeUInt16LE(field.length + 4);
  return Buffer.concat([
    header,
    len,
    Buffer.from('ab', 'latin1'),
    Buffer.from([field.length & 0xff, field.length >> 8]),
    Buffer.from(field, 'latin1'),
    plain.subarray(10),
  ]);
}

/** A zstd skippable frame (magic 0x184D2A50) holding `field`, before a normal frame. */
function zstdSkippable(field: string, body: Buffer): Buffer {
  const frame = Buffer.alloc(8);
  frame.writeUInt32LE(0x184d2a50, 0);
  frame.writeUInt32LE(field.length, 4);
  return Buffer.concat([frame, Buffer.from(field, 'latin1'), zlib.zstdCompressSync(body)]);
}

test('a secret in bytes the decoders skip or hold never reaches the client', async () => {
  let parts: Buffer[] = [];
  let coding = '';
  const up = net.createServer((socket) => {
    socket.once('data', () => {
      const total = parts.reduce((n, p) => n + p.length, 0);
      socket.write(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: ${coding}\r\ncontent-length: ${total}\r\nconnection: close\r\n\r\n`);
      let i = 0;
      const next = (): void => {
        if (i < parts.length) socket.write(parts[i++] as Buffer, () => setTimeout(next, 30));
        else socket.end();
      };
      next();
    });
    socket.on('error', () => socket.destroy());
  });
  await new Promise<void>((r) => up.listen(0, '127.0.0.1', r));
  const gw = await startGateway({ speech: `http://127.0.0.1:${(up.address() as net.AddressInfo).port}` });
  try {
    const key = gw.secrets.speechKey;
    const clean = Buffer.from('{"voices":[]}');
    const zstdJson = zlib.zstdCompressSync(Buffer.from(`{"xi_api_key":"${key}","voices":[{"voice_id":"21m00Tcm4TlvDq8ikWAM"}]}`));
    const at = zstdJson.indexOf(Buffer.from(key)) + key.length;
    const cases: Array<[string, string, Buffer[]]> = [
      ['gzip FNAME', 'gzip', [gzipWithHeaderField(0x08, key, clean)]],
      ['gzip FCOMMENT', 'gzip', [gzipWithHeaderField(0x10, key, clean)]],
      ['gzip FEXTRA', 'gzip', [gzipWithExtra(key, clean)]],
      ['zstd skippable frame', 'zstd', [zstdSkippable(key, clean)]],
      // Split just after the key, as the streaming decoder holds the block's output back.
      ['zstd raw literals, split', 'zstd', at > key.length ? [zstdJson.subarray(0, at), zstdJson.subarray(at)] : [zstdJson]],
    ];
    for (const [name, c, p] of cases) {
      coding = c;
      parts = p;
      const out = Buffer.from(
        await raw(
          gw.port,
          `GET /speech/v1/voices HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\naccept-encoding: ${c}\r\nconnection: close\r\n\r\n`,
          { timeoutMs: 5_000 },
        ),
        'latin1',
      );
      assert.ok(!out.includes(Buffer.from(key)), `${name}: the key reached the client`);
      assert.ok(!out.includes(Buffer.from(key.slice(0, 12))), `${name}: a part of it reached the client`);
    }
  } finally {
    await gw.close();
    up.close();
  }
});
