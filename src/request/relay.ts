// The response body, upstream to client, through the egress filter
// (egress.ts). Relayed by hand rather than with pipe(): the same
// backpressure (pause on a full buffer, resume on drain) with two listeners
// instead of pipe's eight added and removed per request, and a body that
// arrives whole as its Content-Length says goes out with the head in one
// end() call.
//
// A compressed body cannot be masked in place, so it is decompressed on the
// side and scanned; each compressed chunk is held until everything it
// decodes to has been scanned and found clean, with no partial secret at its
// end. A body that turns out to hold a secret is cut there: the client has
// received only compressed bytes whose whole decoded content is clean.
import type { IncomingMessage, ServerResponse } from 'node:http';
import zlib from 'node:zlib';
import type { Transform } from 'node:stream';
import { BodyScan, type SecretForm, type Secrets } from './egress.ts';
import { exchangeOf, type Exchange } from './exchange.ts';
import { upstream } from './outcome.ts';
import { bodyCost, type TopLevelField } from './cost.ts';
import { RunReader } from '../ledger/runs.ts';
import { ZstdFrames } from './zstd-frames.ts';

/** What a response found holding a secret does next; called once per response. */
export type OnSecret = (ex: Exchange, found: readonly SecretForm[], cut: boolean) => void;

type Decoder = () => Transform;
const DECODERS: Readonly<Record<string, Decoder>> = {
  gzip: () => zlib.createGunzip(),
  'x-gzip': () => zlib.createGunzip(),
  deflate: () => zlib.createInflate(),
  br: () => zlib.createBrotliDecompress(),
  ...(typeof zlib.createZstdDecompress === 'function' ? { zstd: () => zlib.createZstdDecompress() } : {}),
};

/** The most content codings a response may stack (docs/security.md); more is a 502. */
const MAX_CODINGS = 3;

/** The decoders for a response, outermost first, and whether the one coding is zstd. */
export interface Decoders {
  readonly list: readonly Decoder[];
  readonly zstd: boolean;
}

const NONE: Decoders = { list: [], zstd: false };

/**
 * The decoders for a Content-Encoding value: none for none or identity,
 * null for what the filter cannot read (the caller refuses it): a coding it
 * has no decoder for, more than MAX_CODINGS, or zstd stacked with another.
 */
export function decodersFor(encoding: string | undefined): Decoders | null {
  if (encoding === undefined) return NONE;
  const codings = encoding
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity');
  // Every coding is one more decoder over the whole body: a response that
  // stacks them (`gzip,gzip,…` three thousand times) is work an upstream
  // forces on the gateway. No real upstream applies more than two.
  if (codings.length > MAX_CODINGS) return null;
  // zstd's release points are found in its own framing (zstd-frames.ts),
  // which another coding around or inside it would hide.
  if (codings.includes('zstd') && codings.length > 1) return null;
  const list: Decoder[] = [];
  // Codings are listed in the order they were applied (RFC 9110 §8.4): undo the last first.
  for (const c of codings.reverse()) {
    const d = DECODERS[c];
    if (d === undefined) return null;
    list.push(d);
  }
  return list.length === 0 ? NONE : { list, zstd: codings[0] === 'zstd' };
}

/** What watches a body for its cost: a top-level field, or a scraper run's object. */
export type BodyWatch = TopLevelField | RunReader;

/** The body ended: what its top-level cost field said, or which run it started. */
function costRead(ex: Exchange, cost: BodyWatch): void {
  if (cost instanceof RunReader) {
    cost.end();
    ex.run = cost.run;
    return;
  }
  const c = bodyCost(cost, ex.route?.cost?.max ?? Infinity);
  ex.cost = c.value;
  ex.costBad = c.bad;
}

/** The upstream's declared body length, or -1 (none, or not a plain number). */
function contentLength(res: IncomingMessage): number {
  const v = res.headers['content-length'];
  if (v === undefined || v.length === 0 || v.length > 15) return -1;
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c < 0x30 || c > 0x39) return -1;
  }
  return Number(v);
}

const ignore = (): void => undefined;

/** The relay of a response, kept on the upstream response so its listeners are shared functions, not closures made per response. */
const RELAY = Symbol('keyward.relay');
type Relayed = IncomingMessage & { [RELAY]?: PlainRelay };

/** The client took what was written: the upstream may send more. */
function resumeUpstream(this: ServerResponse): void {
  const up = exchangeOf(this.req).upstreamResponse;
  if (up !== null && up.isPaused()) up.resume();
}

function send(proxyRes: IncomingMessage, res: ServerResponse, out: Buffer): void {
  if (out.length > 0 && !res.write(out)) {
    proxyRes.pause();
    // One listener per response, added the first time the client falls behind.
    if (res.listenerCount('drain') === 0) res.on('drain', resumeUpstream);
  }
}

/**
 * Compressed data by its magic bytes, whatever the labels: a gzip member
 * (RFC 1952 §2.3.1), a zlib stream (RFC 1950 §2.2: deflate, a window up to
 * 32 KiB, a header check that divides by 31), a zstd frame or skippable
 * frame (RFC 8878 §3.1). A body sent as `identity` or unlabelled that is one
 * of these is decoded by many clients (a saved `.gz`, a lenient library), so
 * it is scanned decoded too.
 */
function sniff(start: Buffer): Decoders | null {
  const [a, b, c, d] = start;
  if (a === 0x1f && b === 0x8b && c === 0x08) return { list: [DECODERS.gzip as Decoder], zstd: false };
  if (a !== undefined && b !== undefined && (a & 0x0f) === 8 && a >> 4 <= 7 && ((a << 8) | b) % 31 === 0) return { list: [DECODERS.deflate as Decoder], zstd: false };
  const zstd = DECODERS.zstd;
  if (zstd !== undefined && d !== undefined && ((a === 0x28 && b === 0xb5 && c === 0x2f && d === 0xfd) || (a !== undefined && (a & 0xf0) === 0x50 && b === 0x2a && c === 0x4d && d === 0x18))) {
    return { list: [zstd], zstd: true };
  }
  return null;
}

/** Bytes the sniff needs before it can say. */
const SNIFF_BYTES = 4;

/**
 * A body that is not labelled compressed, relayed as it streams: each chunk
 * goes out as it came (the same Buffer, when it holds no secret and does not
 * end in a possible start of one), with backpressure (pause on a full client
 * buffer, resume on drain), its bytes counted and its cost read on the way.
 * With the filter on, the first bytes are sniffed: one that is compressed
 * after all (sniff) goes to relayCompressed from its first bytes.
 */
class PlainRelay {
  readonly #up: IncomingMessage;
  readonly #res: ServerResponse;
  readonly #ex: Exchange;
  readonly #secrets: Secrets;
  readonly #limits: DecodeLimits;
  readonly #onSecret: OnSecret;
  readonly #cost: BodyWatch | null;
  readonly #scan: BodyScan | null;
  /** The whole body's length when declared: a body that arrives as one chunk goes out with the head in one end(). */
  readonly #whole: number;
  /** The first bytes, until the sniff has enough to say (filter on only); null once it said. */
  #start: Buffer | null;

  constructor(up: IncomingMessage, res: ServerResponse, ex: Exchange, secrets: Secrets, limits: DecodeLimits, onSecret: OnSecret, cost: BodyWatch | null) {
    this.#up = up;
    this.#res = res;
    this.#ex = ex;
    this.#secrets = secrets;
    this.#limits = limits;
    this.#onSecret = onSecret;
    this.#cost = cost;
    this.#whole = contentLength(up);
    this.#scan = secrets.empty ? null : new BodyScan(secrets);
    this.#start = this.#scan === null ? null : EMPTY;
  }

  data(chunk: Buffer): void {
    if (this.#start === null) return this.#relay(chunk);
    const start = this.#start.length === 0 ? chunk : Buffer.concat([this.#start, chunk]);
    if (start.length < SNIFF_BYTES) {
      this.#start = start;
      return;
    }
    this.#start = null;
    const compressed = sniff(start);
    if (compressed === null) return this.#relay(start);
    const up = this.#up as Relayed;
    up.removeListener('data', onPlainData);
    up.removeListener('end', onPlainEnd);
    up[RELAY] = undefined;
    relayCompressed(up, this.#res, this.#ex, this.#secrets, compressed, this.#limits, this.#onSecret, this.#cost, () => true, () => undefined, start);
  }

  #relay(chunk: Buffer): void {
    this.#ex.bytesOut += chunk.length;
    // Watched on its way, never held: the cost reader only reads.
    this.#cost?.push(chunk);
    if (this.#scan === null) this.#write(chunk);
    else this.#scan.pushTo(chunk, this.#write);
  }

  /** One part of the body on its way out; the whole body at once goes out with the head in one end(). */
  readonly #write = (out: Buffer): void => {
    if (out.length === this.#whole) this.#res.end(out);
    else send(this.#up, this.#res, out);
  };

  end(): void {
    const start = this.#start;
    if (start !== null && start.length > 0) {
      this.#start = null;
      this.#relay(start);
    }
    if (this.#cost !== null) costRead(this.#ex, this.#cost);
    const scan = this.#scan;
    const rest = scan === null ? null : scan.end();
    if (scan !== null && scan.found !== null) this.#onSecret(this.#ex, scan.found, false);
    if (!this.#res.writableEnded) this.#res.end(rest ?? undefined);
  }
}

const EMPTY = Buffer.alloc(0);

function onPlainData(this: Relayed, chunk: Buffer): void {
  this[RELAY]?.data(chunk);
}

function onPlainEnd(this: Relayed): void {
  this[RELAY]?.end();
}

/** Relay a body that is not labelled compressed, masking secrets as it streams (no secrets: filter off). */
export function relayPlain(proxyRes: IncomingMessage, res: ServerResponse, ex: Exchange, secrets: Secrets, limits: DecodeLimits, onSecret: OnSecret, cost: BodyWatch | null): void {
  const up = proxyRes as Relayed;
  up[RELAY] = new PlainRelay(proxyRes, res, ex, secrets, limits, onSecret, cost);
  up.on('data', onPlainData);
  up.on('end', onPlainEnd);
}

/** What one response may make the gateway decode (docs/security.md, "Work an upstream can force"). */
export interface DecodeLimits {
  /** Decoded bytes scanned per response, at most. */
  readonly maxDecodedBytes: number;
  /** Decoded bytes per byte received, at most, once past RATIO_FROM. */
  readonly maxRatio: number;
}

/** Below this many decoded bytes the ratio is not judged (a small honest body can compress very well). */
const RATIO_FROM = 1024 * 1024;
/**
 * Compressed bytes held past the last release, at most: room for a zstd
 * block (128 KiB) and more. Past it the response is cut: an honest body
 * does not go on this long decoding to nothing but a possible secret's start.
 */
const MAX_HELD = 1024 * 1024;

/** Relay a compressed body, scanning a decompressed copy (see the header comment). */
export function relayCompressed(
  proxyRes: IncomingMessage,
  res: ServerResponse,
  ex: Exchange,
  secrets: Secrets,
  decoders: Decoders,
  limits: DecodeLimits,
  onSecret: OnSecret,
  cost: BodyWatch | null,
  head: () => boolean,
  undecodable: () => void,
  sniffed: Buffer | null = null,
): void {
  /** The status and headers went out (with the first bytes released, or at the end); a sniffed body's went already. */
  let headed = sniffed !== null;
  const headOnce = (): boolean => {
    if (headed) return true;
    headed = true;
    return head();
  };
  const scan = new BodyScan(secrets);
  // The compressed bytes themselves, as they are: what decoders skip (gzip's
  // FNAME, FCOMMENT and FEXTRA, zstd's skippable frames) and literals a
  // coding stores raw are sent to the client as they are, secret and all.
  const raw = new BodyScan(secrets);
  // zstd releases a block's output only once the block is whole (zstd-frames.ts).
  const frames = decoders.zstd ? new ZstdFrames() : null;
  let stages: Transform[] = [];
  /** Bytes given to each stage: what it must have consumed by its end. */
  let fed: number[] = [];
  /** Compressed bytes not yet released, from offset `released` of the body. */
  let queue: Buffer[] = [];
  let released = 0;
  let decoded = 0;
  /**
   * (compressed offset, decoded bytes) after each settled chunk, decoded
   * strictly increasing: the compressed bytes before the offset decode to
   * no more than that many bytes. Only the marks still within the scan's
   * held tail are kept.
   */
  let marks: number[] = [];
  let cut = false;
  const halt = (): void => {
    cut = true;
    queue = [];
    for (const s of stages) s.destroy();
    proxyRes.destroy();
  };
  const stop = (found: readonly SecretForm[] | null): void => {
    if (cut) return;
    halt();
    if (found !== null) onSecret(ex, found, true);
    res.destroy();
  };
  /**
   * A body sniffed as compressed (not labelled so) that turns out not to be
   * (plain text that begins `x^`) or to go on past its compressed data: the
   * client's decoder stops where ours did, so from here on it is relayed as
   * a plain body, its raw bytes masked as they stream.
   */
  let plain = false;
  /** The upstream's body ended (the decoders may still be working on it). */
  let ended = false;
  const finishPlain = (): void => {
    const rest = raw.end();
    if (raw.found !== null) onSecret(ex, raw.found, false);
    if (!res.writableEnded) res.end(rest ?? undefined);
  };
  const toPlain = (): void => {
    plain = true;
    for (const s of stages) s.destroy();
    releaseTo((fed[0] as number) - raw.holding);
    queue = [];
    if (ended) finishPlain();
    else if (!res.writableNeedDrain) proxyRes.resume();
  };
  // Not scannable, so not relayed: before anything went, a 502 says so; after, the response is cut.
  const refuse = (detail: string): void => {
    if (cut || plain) return;
    // A sniffed body that does not decode (or ends early) is plain after all; one over a bound is cut like any other.
    if (sniffed !== null && (detail === 'undecodable' || detail === 'trailing_bytes')) return toPlain();
    ex.fail(upstream('unscannable_encoding', detail));
    if (headed) return stop(null);
    headed = true;
    halt();
    undecodable();
  };
  // A client that leaves stops every decoder and the upstream response at once.
  res.once('close', () => {
    if (!res.writableFinished && !cut) halt();
  });
  const open = (): void => {
    stages = decoders.list.map((d) => d());
    fed = stages.map(() => 0);
    for (let i = 1; i < stages.length; i++) {
      (stages[i - 1] as Transform).pipe(stages[i] as Transform);
      (stages[i - 1] as Transform).on('data', (d: Buffer) => (fed[i] = (fed[i] as number) + d.length));
    }
    for (const [i, s] of stages.entries()) {
      s.on('error', () => refuse('undecodable'));
      // A decoder ends at the end of its compressed data and drops whatever
      // follows (`deflate(…) + "apify_api_…"`): bytes that were never decoded
      // were never scanned, so the response is cut before any of them goes.
      s.on('end', () => {
        if ((s as unknown as zlib.Zlib).bytesWritten < (fed[i] as number)) refuse('trailing_bytes');
      });
    }
    (stages.at(-1) as Transform).on('data', (plain: Buffer) => {
      if (cut) return;
      decoded += plain.length;
      // A bomb (6 KB of brotli that inflates to 4 GiB): what one response may make the gateway decode is bounded.
      if (decoded > limits.maxDecodedBytes || (decoded > RATIO_FROM && decoded > limits.maxRatio * (fed[0] as number))) return refuse('decoded_limit');
      cost?.push(plain);
      // Scanned for what it holds and where a possible secret starts; the decoded bytes themselves are not sent.
      scan.pushTo(plain, ignore);
      if (scan.found !== null) stop(scan.found);
    });
  };
  // Everything written so far has been decoded and scanned once each stage,
  // in order, has processed a flush queued behind it.
  const settle = (then: () => void): void => {
    let i = 0;
    const next = (): void => {
      if (cut || plain) return;
      const s = stages[i++];
      if (s === undefined) then();
      else (s as unknown as zlib.Zlib).flush(() => setImmediate(next));
    };
    next();
  };
  /** Send the queued compressed bytes up to body offset `to`. */
  const releaseTo = (to: number): void => {
    if (to <= released || cut) return;
    if (!headOnce()) {
      cut = true;
      return;
    }
    while (released < to && queue.length > 0) {
      const c = queue[0] as Buffer;
      const n = Math.min(c.length, to - released);
      send(proxyRes, res, n === c.length ? c : c.subarray(0, n));
      if (n === c.length) queue.shift();
      else queue[0] = c.subarray(n);
      released += n;
    }
  };
  /**
   * After a settled chunk: release every compressed byte whose whole decoded
   * content is scanned and clean and lies before the scan's held tail (a
   * possible start of a secret), and that is not itself a possible start of
   * a secret as it stands. What is held stays bounded by the longest
   * secret's spelling, decoded, whatever the body (a body of `a`s, each
   * chunk ending in a secret's first byte, goes out as it comes).
   */
  const releaseClean = (): void => {
    const offset = frames === null ? (fed[0] as number) : frames.safe;
    if (marks.length >= 2 && marks[marks.length - 1] === decoded) marks[marks.length - 2] = offset;
    else marks.push(offset, decoded);
    const clean = decoded - scan.holding;
    let to = -1;
    let k = 0;
    for (; k < marks.length && (marks[k + 1] as number) <= clean; k += 2) to = marks[k] as number;
    marks = marks.slice(k);
    if (to >= 0) releaseTo(Math.min(to, (fed[0] as number) - raw.holding));
    if ((fed[0] as number) - released > MAX_HELD) refuse('held');
  };
  const onData = (chunk: Buffer): void => {
    if (cut) return;
    ex.bytesOut += chunk.length;
    if (plain) {
      raw.pushTo(chunk, (out) => send(proxyRes, res, out));
      return;
    }
    if (stages.length === 0) open();
    // What goes is the raw scan's output: the same bytes, less a tail that
    // may start a secret (it goes with the next chunk), a secret masked. A
    // labelled body with a secret in its raw bytes is cut; a sniffed one
    // may be plain text after all, so it goes on, masked.
    const outs: Buffer[] = [];
    raw.pushTo(chunk, (out) => outs.push(out));
    if (raw.found !== null && sniffed === null) return stop(raw.found);
    queue.push(...outs);
    frames?.push(chunk);
    proxyRes.pause();
    fed[0] = (fed[0] as number) + chunk.length;
    (stages[0] as Transform).write(chunk);
    settle(() => {
      releaseClean();
      if (!cut && !res.writableNeedDrain) proxyRes.resume();
    });
  };
  proxyRes.on('data', onData);
  if (sniffed !== null) onData(sniffed);
  proxyRes.on('end', () => {
    ended = true;
    if (cut) return;
    if (plain) return finishPlain();
    if (stages.length === 0) {
      if (headOnce() && !res.writableEnded) res.end();
      return;
    }
    (stages.at(-1) as Transform).on('end', () => {
      if (cut || plain) return;
      const rest = raw.end();
      if (raw.found !== null && sniffed === null) return stop(raw.found);
      if (rest !== null) queue.push(rest);
      if (raw.found !== null) onSecret(ex, raw.found, false);
      if (cost !== null) costRead(ex, cost);
      // The body ended: a tail held as a possible start of a secret is none.
      releaseTo(fed[0] as number);
      if (!cut && headOnce() && !res.writableEnded) res.end();
    });
    (stages[0] as Transform).end();
  });
}
