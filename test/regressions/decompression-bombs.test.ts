// Bombs: 6.4 KB of brotli inflating to 4 GiB took ~21 s of CPU, 0.5 MB of
// gzip inflating to 512 MiB 8.5 s, 160 KB of zstd inflating to 5 GiB 16 s,
// and on the SEO route the cost reader read every decoded byte on the main
// thread. What one response may make the gateway decode is now bounded:
// KEYWARD_EGRESS_MAX_DECODED in all, and KEYWARD_EGRESS_MAX_RATIO decoded
// bytes per byte received past the first MiB (docs/security.md). Past either
// the response is cut (or a 502 before anything went), logged with
// `decoded_limit` and counted.
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import zlib from 'node:zlib';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { parseProm } from '../support/prom.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

const BOMBS: ReadonlyArray<[string, () => Buffer]> = [
  // 256 MiB of zeros each: ratios in the thousands.
  ['br', () => zlib.brotliCompressSync(Buffer.alloc(256 * 1024 * 1024), { params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 1 } })],
  ['gzip', () => zlib.gzipSync(Buffer.alloc(256 * 1024 * 1024), { level: 9 })],
  ['zstd', () => zlib.zstdCompressSync(Buffer.alloc(256 * 1024 * 1024))],
];

test('a decompression bomb is cut at the ratio bound, logged and counted, for every coding, on the route that reads costs', async () => {
  let body: Buffer = Buffer.alloc(0);
  let coding = '';
  const up = await startRawUpstream(() =>
    Buffer.concat([
      Buffer.from(`HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: ${coding}\r\ncontent-length: ${body.length}\r\n\r\n`),
      body,
    ]),
  );
  const gw = await startGateway({ seo: up.url });
  try {
    for (const [name, make] of BOMBS) {
      coding = name;
      body = make();
      assert.ok(body.length < 1024 * 1024, `${name} bomb is ${body.length} bytes`);
      const r = await request(`${gw.url}/seo/v3/serp/google/organic/live/advanced`, {
        method: 'POST',
        headers: { authorization: `Bearer ${gw.token}`, 'accept-encoding': name, 'content-type': 'application/json' },
        body: '[]',
        timeoutMs: 20_000,
      }).catch((err: Error) => ({ status: 0, body: Buffer.alloc(0), error: err }));
      // Either a 502 before anything went, or a cut: never the 256 MiB.
      assert.ok(r.status === 502 || r.status === 0 || r.body.length < 4 * 1024 * 1024, `${name}: ${r.status} with ${r.body.length} bytes`);
      await eventually(
        () =>
          gw.logs().filter((l) => l.msg === 'request completed' && l.error === 'decoded_limit').length ===
          BOMBS.indexOf(BOMBS.find(([n]) => n === name) as (typeof BOMBS)[number]) + 1,
        10_000,
        `${name} logged decoded_limit`,
      );
    }
    const m = parseProm(await gw.gateway.metrics.text());
    assert.equal(m.sum('keyward_upstream_errors_total', { route: 'seo', reason: 'decoded_limit' }), BOMBS.length);
    // The ledger counts no cost read from a body that was never fully scanned.
    const line = gw
      .logs()
      .filter((l) => l.msg === 'request completed')
      .at(-1) as Record<string, unknown>;
    assert.equal(line.status === 502 || line.aborted === true, true);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('KEYWARD_EGRESS_MAX_DECODED bounds a body that compresses honestly; below both bounds a body passes whole', async () => {
  let body: Buffer = Buffer.alloc(0);
  const up = await startRawUpstream(() =>
    Buffer.concat([
      Buffer.from(`HTTP/1.1 200 OK\r\ncontent-type: application/octet-stream\r\ncontent-encoding: gzip\r\ncontent-length: ${body.length}\r\n\r\n`),
      body,
    ]),
  );
  const gw = await startGateway({ speech: up.url, env: { KEYWARD_EGRESS_MAX_DECODED: '2MiB', KEYWARD_EGRESS_MAX_RATIO: '50' } });
  try {
    const get = (): ReturnType<typeof request> =>
      request(`${gw.url}/speech/v1/history`, { headers: { authorization: `Bearer ${gw.token}`, 'accept-encoding': 'gzip' }, timeoutMs: 10_000 }).catch(
        () => ({ status: 0, body: Buffer.alloc(0) }) as unknown as Awaited<ReturnType<typeof request>>,
      );
    // 1.5 MiB that does not compress: under both bounds.
    const small = randomBytes(1.5 * 1024 * 1024);
    body = zlib.gzipSync(small);
    const ok = await get();
    assert.equal(ok.status, 200);
    assert.deepEqual(zlib.gunzipSync(ok.body), small);
    // 3 MiB that does not compress: past the absolute bound.
    body = zlib.gzipSync(randomBytes(3 * 1024 * 1024));
    const big = await get();
    assert.ok(big.status === 0 || big.body.length < body.length, `${big.status} ${big.body.length}`);
    // 1.5 MiB of one byte: ratio ~1000 past the first MiB.
    body = zlib.gzipSync(Buffer.alloc(1.5 * 1024 * 1024, 0x41));
    const bomb = await get();
    assert.equal(bomb.status, 502);
    await eventually(() => gw.logs().filter((l) => l.msg === 'request completed' && l.error === 'decoded_limit').length === 2, 5_000, 'both logged');
  } finally {
    await gw.close();
    await up.close();
  }
});
