// The compressed relay's decode, scan and release, driven without sockets
// (docs/security.md, "Compressed bodies"): an upstream stream and a
// response that records what it was given. Compressed bytes go only once
// everything they decode to was scanned clean; a secret cuts the response
// before the bytes that would complete it; a body that does not decode
// before anything went is the caller's 502.
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { PassThrough, Writable } from 'node:stream';
import { test } from 'node:test';
import zlib from 'node:zlib';
import { secretForm, Secrets, type SecretForm } from '../../src/request/egress.ts';
import type { Exchange } from '../../src/request/exchange.ts';
import { cleanUpTo, decodersFor, relayCompressed } from '../../src/request/relay.ts';
import { deadline } from '../support/deadline.ts';

const SECRET = 'seo-password-0123456789abcdef';
const secrets = new Secrets([secretForm('seo', 'password', SECRET)]);
const limits = { maxDecodedBytes: 64 * 1024 * 1024, maxRatio: 1000 };

interface Run {
  readonly sent: Buffer[];
  readonly found: Array<{ forms: readonly SecretForm[]; cut: boolean }>;
  readonly failures: unknown[];
  heads: number;
  undecodable: number;
  /** Resolves when the response ended or was destroyed. */
  readonly done: Promise<'ended' | 'destroyed'>;
}

/** Feed `chunks` as an upstream body labelled `coding`; what the response got. */
function relay(coding: string, chunks: readonly Buffer[]): Run {
  const up = new PassThrough();
  let finish: (how: 'ended' | 'destroyed') => void = () => undefined;
  const run: Run = { sent: [], found: [], failures: [], heads: 0, undecodable: 0, done: new Promise((r) => (finish = r)) };
  const res = new Writable({
    highWaterMark: 1 << 30,
    write(chunk: Buffer, _enc, cb) {
      run.sent.push(chunk);
      cb();
    },
  });
  res.on('finish', () => finish('ended'));
  res.on('close', () => finish(res.writableFinished ? 'ended' : 'destroyed'));
  // The exchange's part the relay touches: bytes relayed counted, a failure noted.
  const counted = { bytesOut: 0 };
  const ex = {
    relayed: (n: number) => void (counted.bytesOut += n),
    fail: (f: unknown) => run.failures.push(f),
  } as unknown as Exchange;
  const decoders = decodersFor(coding);
  assert.ok(decoders !== null);
  relayCompressed({
    proxyRes: up as unknown as IncomingMessage,
    res: res as unknown as ServerResponse,
    ex,
    secrets,
    limits,
    onSecret: (_ex, forms, cut) => run.found.push({ forms, cut }),
    watch: null,
    decoders,
    head: () => {
      run.heads++;
      return true;
    },
    undecodable: () => {
      run.undecodable++;
      res.destroy();
    },
    sniffed: null,
  });
  // One chunk at a time, as a socket would deliver them.
  void (async () => {
    for (const c of chunks) {
      up.write(c);
      await new Promise((r) => setImmediate(r));
    }
    up.end();
  })();
  return run;
}

const split = (b: Buffer, n: number): Buffer[] => Array.from({ length: Math.ceil(b.length / n) }, (_, i) => b.subarray(i * n, (i + 1) * n));

test('cleanUpTo: compressed bytes are released up to the last mark whose decoded bytes are all clean', () => {
  const marks: number[] = [];
  // 100 compressed bytes decoded to 1,000, of which 990 are clean (10 held as a possible secret's start): nothing yet.
  assert.equal(cleanUpTo(marks, 100, 1_000, 990), -1);
  // 200 decoded to 2,000, 1,995 clean: the first 100 may go.
  assert.equal(cleanUpTo(marks, 200, 2_000, 1_995), 100);
  assert.deepEqual(marks, [200, 2_000]);
  // Nothing more decoded: the mark moves on to the new offset instead of adding one.
  assert.equal(cleanUpTo(marks, 250, 2_000, 2_000), 250);
  assert.deepEqual(marks, []);
});

for (const coding of ['gzip', 'br', 'deflate']) {
  const encode = coding === 'gzip' ? zlib.gzipSync : coding === 'br' ? zlib.brotliCompressSync : zlib.deflateSync;
  test(`${coding}: a clean body goes out byte for byte with its head once; one echoing a secret is cut before the bytes that complete it`, async () => {
    const clean = encode(Buffer.from(JSON.stringify({ items: Array.from({ length: 2_000 }, (_, i) => ({ i, text: `item ${i} of a clean body` })) })));
    const ok = relay(coding, split(clean, 1_000));
    assert.equal(await deadline(ok.done, 5_000, 'the clean body relayed'), 'ended');
    assert.deepEqual(Buffer.concat(ok.sent), clean);
    assert.equal(ok.heads, 1);
    assert.deepEqual(ok.found, []);

    const plain = Buffer.from(`${'x'.repeat(50_000)}"password":"${SECRET}"${'y'.repeat(50_000)}`);
    const leaky = encode(plain);
    // Small pieces, so the secret decodes across several of them and a possible start of it is held.
    const bad = relay(coding, split(leaky, 3));
    assert.equal(await deadline(bad.done, 5_000, 'the leaky body cut'), 'destroyed');
    assert.equal(bad.found.length, 1);
    assert.equal(bad.found[0]?.cut, true);
    // What went decodes (as far as it goes) to the text before the secret.
    const got = Buffer.concat(bad.sent);
    assert.ok(got.length < leaky.length, `cut: ${got.length} of ${leaky.length} bytes went`);
    const decodedSoFar = (() => {
      const chunks: Buffer[] = [];
      const d = coding === 'gzip' ? zlib.createGunzip() : coding === 'br' ? zlib.createBrotliDecompress() : zlib.createInflate();
      d.on('data', (c: Buffer) => chunks.push(c));
      d.on('error', () => undefined);
      d.write(got);
      return new Promise<Buffer>((r) => d.flush(() => r(Buffer.concat(chunks))));
    })();
    // Not even its start: what may be the start of a secret is held until the bytes after it say.
    const seen = (await decodedSoFar).toString('latin1');
    assert.equal(seen.includes(SECRET.slice(0, 4)), false, `the client could decode ${JSON.stringify(seen.slice(-40))}`);
    assert.ok(seen.length >= 50_000, `the clean text before it went (${seen.length} bytes)`);
  });
}

test('a body that does not decode, before anything went: no head, no byte, the caller answers (undecodable)', async () => {
  const run = relay('gzip', [Buffer.from('this is not gzip at all, just text that claims to be')]);
  assert.equal(await deadline(run.done, 5_000, 'the relay refused'), 'destroyed');
  assert.equal(run.undecodable, 1);
  assert.equal(run.heads, 0);
  assert.deepEqual(run.sent, []);
  assert.equal(run.failures.length, 1);
});
