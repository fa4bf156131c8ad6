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
import { bodyCost, RunReader, type BodyWatch } from './cost.ts';
import { ZstdFrames } from './zstd-frames.ts';

/** What a response found holding a secret does next; called once per response. */
export type OnSecret = (ex: Exchange, found: readonly SecretForm[], cut: boolean) => void;

type Decoder = () => Transform;
/**
 * Decoded bytes per output Buffer: a socket read's size rather than zlib's
 * 16 KiB, so a decoded body is a quarter as many Buffers and native round
 * trips (each Buffer's memory lies outside the heap, and their count brings
 * full collections forward).
 */
const OUT = { chunkSize: 64 * 1024 };
const DECODERS: Readonly<Record<string, Decoder>> = {
  gzip: () => zlib.createGunzip(OUT),
  'x-gzip': () => zlib.createGunzip(OUT),
  deflate: () => zlib.createInflate(OUT),
  br: () => zlib.createBrotliDecompress(OUT),
  ...(typeof zlib.createZstdDecompress === 'function' ? { zstd: () => zlib.createZstdDecompress(OUT) } : {}),
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

/** The body ended: what its top-level cost field said, or which run it started. */
function watchEnded(ex: Exchange, watch: BodyWatch): void {
  if (watch instanceof RunReader) {
    watch.end();
    ex.runStarted(watch.run);
    return;
  }
  const c = bodyCost(watch, ex.route?.cost?.max ?? Infinity);
  ex.costIs(c.value, c.bad, c.seen);
}

/** The upstream's declared body length, or -1 (none, or not a plain number). */
function contentLength(proxyRes: IncomingMessage): number {
  const v = proxyRes.headers['content-length'];
  if (v === undefined || v.length === 0 || v.length > 15) return -1;
  for (let i = 0; i < v.length; i++) {
    const c = v.charCodeAt(i);
    if (c < 0x30 || c > 0x39) return -1;
  }
  return Number(v);
}

const ignore = (): void => undefined;

/** What a response's relay works with. */
export interface RelayParts {
  /** The upstream's response. */
  readonly proxyRes: IncomingMessage;
  readonly res: ServerResponse;
  readonly ex: Exchange;
  readonly secrets: Secrets;
  readonly limits: DecodeLimits;
  readonly onSecret: OnSecret;
  /** Watches the body for its cost or its run, reading only; null: nothing to read. */
  readonly watch: BodyWatch | null;
}

/** The relay of a response, kept on the upstream response so its listeners are shared functions, not closures made per response. */
const RELAY = Symbol('keyward.relay');
type Relayed = IncomingMessage & { [RELAY]?: PlainRelay };

/** The client took what was written: the upstream may send more. */
function resumeUpstream(this: ServerResponse): void {
  const proxyRes = exchangeOf(this.req).proxyRes;
  if (proxyRes !== null && proxyRes.isPaused()) proxyRes.resume();
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
  if (a !== undefined && b !== undefined && (a & 0x0f) === 8 && a >> 4 <= 7 && ((a << 8) | b) % 31 === 0)
    return { list: [DECODERS.deflate as Decoder], zstd: false };
  const zstd = DECODERS.zstd;
  if (
    zstd !== undefined &&
    d !== undefined &&
    ((a === 0x28 && b === 0xb5 && c === 0x2f && d === 0xfd) || (a !== undefined && (a & 0xf0) === 0x50 && b === 0x2a && c === 0x4d && d === 0x18))
  ) {
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
  readonly #parts: RelayParts;
  readonly #proxyRes: IncomingMessage;
  readonly #res: ServerResponse;
  readonly #ex: Exchange;
  readonly #onSecret: OnSecret;
  readonly #watch: BodyWatch | null;
  readonly #scan: BodyScan | null;
  /** The whole body's length when declared: a body that arrives as one chunk goes out with the head in one end(). */
  readonly #whole: number;
  /** The first bytes, until the sniff has enough to say (filter on only); null once it said. */
  #start: Buffer | null;

  constructor(parts: RelayParts) {
    this.#parts = parts;
    this.#proxyRes = parts.proxyRes;
    this.#res = parts.res;
    this.#ex = parts.ex;
    this.#onSecret = parts.onSecret;
    this.#watch = parts.watch;
    this.#whole = contentLength(parts.proxyRes);
    this.#scan = parts.secrets.empty ? null : new BodyScan(parts.secrets);
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
    const proxyRes = this.#proxyRes as Relayed;
    proxyRes.removeListener('data', onPlainData);
    proxyRes.removeListener('end', onPlainEnd);
    proxyRes[RELAY] = undefined;
    relayCompressed({ ...this.#parts, decoders: compressed, head: () => true, undecodable: () => undefined, sniffed: start });
  }

  #relay(chunk: Buffer): void {
    this.#ex.relayed(chunk.length);
    // Watched on its way, never held: the cost reader only reads.
    this.#watch?.push(chunk);
    if (this.#scan === null) this.#write(chunk);
    else this.#scan.pushTo(chunk, this.#write);
  }

  /** One part of the body on its way out; the whole body at once goes out with the head in one end(). */
  readonly #write = (out: Buffer): void => {
    if (out.length === this.#whole) this.#res.end(out);
    else send(this.#proxyRes, this.#res, out);
  };

  end(): void {
    const start = this.#start;
    if (start !== null && start.length > 0) {
      this.#start = null;
      this.#relay(start);
    }
    if (this.#watch !== null) watchEnded(this.#ex, this.#watch);
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
export function relayPlain(parts: RelayParts): void {
  const proxyRes = parts.proxyRes as Relayed;
  proxyRes[RELAY] = new PlainRelay(parts);
  proxyRes.on('data', onPlainData);
  proxyRes.on('end', onPlainEnd);
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

/** What a compressed body's relay works with, besides the response's own. */
export interface CompressedParts extends RelayParts {
  readonly decoders: Decoders;
  /** Send the status and headers; false: they could not go (the response is cut). */
  readonly head: () => boolean;
  /** The body does not decode before anything went: the caller answers 502. */
  readonly undecodable: () => void;
  /** The first bytes of a body not labelled compressed that sniffed as compressed (its head went already); null: labelled. */
  readonly sniffed: Buffer | null;
}

/** Relay a compressed body, scanning a decompressed copy (see the header comment). */
export function relayCompressed(parts: CompressedParts): void {
  new CompressedRelay(parts).start();
}

/**
 * Where a compressed relay stands (`#state`). Beside it two facts: whether
 * the head went (`#headed`) and whether the upstream's body ended (`#ended`).
 *
 *   waiting ──first bytes (decoders opened)──▶ decoding
 *   waiting ──body ended with no bytes──────────────────────▶ done
 *   decoding ──decoders ended, the rest released────────────▶ done
 *   decoding ──a sniffed body that is not compressed──▶ plain ──body ended──▶ done
 *   any but done ──a secret, a bound passed, a decoder error, the client gone,
 *                  the head that could not go────────────────▶ stopped
 *
 * `done` is reached only through `#finish` (the response ended); `stopped`
 * only through `#stopReading` (decoders and the upstream response destroyed;
 * `#cutResponse` also destroys the client's response, `#unscannable` before
 * the head asks the caller for a 502), or when the head could not go.
 */
type RelayState = 'waiting' | 'decoding' | 'plain' | 'done' | 'stopped';

/**
 * A compressed body on its way: its raw bytes queued, scanned as they are
 * (`raw`) and decoded through `stages` into the scan of what they decode to
 * (`scan`); compressed bytes released up to the last point whose whole
 * decoded content was scanned clean. It ends relayed whole, cut (a secret,
 * a bound passed, a decoder error after the head went), refused before
 * anything went (`undecodable`), or, for a sniffed body that is not
 * compressed after all, relayed as plain text from there (`RelayState`).
 */
export class CompressedRelay {
  readonly #parts: CompressedParts;
  /** The status and headers went (with the first bytes released, or at the end); a sniffed body's went already. */
  #headed: boolean;
  readonly #scan: BodyScan;
  /**
   * The compressed bytes themselves, as they are: what decoders skip (gzip's
   * FNAME, FCOMMENT and FEXTRA, zstd's skippable frames) and literals a
   * coding stores raw are sent to the client as they are, secret and all.
   */
  readonly #raw: BodyScan;
  /** zstd releases a block's output only once the block is whole (zstd-frames.ts). */
  readonly #frames: ZstdFrames | null;
  #stages: Transform[] = [];
  /** Bytes fed to the outermost decoder: the body's raw bytes so far. */
  #rawFed = 0;
  /** Compressed bytes not yet released, from offset `released` of the body. */
  #queue: Buffer[] = [];
  #released = 0;
  #decoded = 0;
  /**
   * (compressed offset, decoded bytes) after each chunk fully decoded and scanned, decoded
   * strictly increasing: the compressed bytes before the offset decode to no
   * more than that many bytes. Only the marks still within the scan's held
   * tail are kept.
   */
  #marks: number[] = [];
  /**
   * `plain`: a body sniffed as compressed (not labelled so) that turns out
   * not to be (plain text that begins `x^`) or to go on past its compressed
   * data: the client's decoder stops where ours did, so from there on it is
   * relayed as a plain body, its raw bytes masked as they stream.
   */
  #state: RelayState = 'waiting';
  /** The upstream's body ended (the decoders may still be working on it). */
  #ended = false;

  constructor(parts: CompressedParts) {
    this.#parts = parts;
    this.#headed = parts.sniffed !== null;
    this.#scan = new BodyScan(parts.secrets);
    this.#raw = new BodyScan(parts.secrets);
    this.#frames = parts.decoders.zstd ? new ZstdFrames() : null;
  }

  start(): void {
    const { proxyRes, res, sniffed } = this.#parts;
    // A client that leaves stops every decoder and the upstream response at once.
    res.once('close', () => {
      if (!res.writableFinished && this.#state !== 'stopped') this.#stopReading();
    });
    proxyRes.on('data', this.#onData);
    if (sniffed !== null) this.#onData(sniffed);
    proxyRes.on('end', this.#onEnd);
  }

  /** Read through a call: a field narrowed by an earlier check may have changed in the calls since. */
  #stopped(): boolean {
    return this.#state === 'stopped';
  }

  #headOnce(): boolean {
    if (this.#headed) return true;
    this.#headed = true;
    return this.#parts.head();
  }

  #stopReading(): void {
    this.#state = 'stopped';
    this.#queue = [];
    for (const s of this.#stages) s.destroy();
    this.#parts.proxyRes.destroy();
  }

  #cutResponse(found: readonly SecretForm[] | null): void {
    if (this.#state === 'stopped') return;
    this.#stopReading();
    if (found !== null) this.#parts.onSecret(this.#parts.ex, found, true);
    this.#parts.res.destroy();
  }

  /** The one normal end: the response ends with `rest` (its head first, if it has not gone). */
  #finish(rest: Buffer | null): void {
    this.#state = 'done';
    const { res } = this.#parts;
    if (this.#headOnce() && !res.writableEnded) res.end(rest ?? undefined);
  }

  #finishPlain(): void {
    const { ex, onSecret } = this.#parts;
    const rest = this.#raw.end();
    if (this.#raw.found !== null) onSecret(ex, this.#raw.found, false);
    this.#finish(rest);
  }

  #toPlain(): void {
    this.#state = 'plain';
    for (const s of this.#stages) s.destroy();
    this.#releaseTo(this.#rawFed - this.#raw.holding);
    this.#queue = [];
    if (this.#ended) this.#finishPlain();
    else if (!this.#parts.res.writableNeedDrain) this.#parts.proxyRes.resume();
  }

  /** Not scannable, so not relayed: before anything went, a 502 says so; after, the response is cut. */
  #unscannable(detail: string): void {
    if (this.#state !== 'decoding' && this.#state !== 'waiting') return;
    // A sniffed body that does not decode (or ends early) is plain after all; one over a bound is cut like any other.
    if (this.#parts.sniffed !== null && (detail === 'undecodable' || detail === 'trailing_bytes')) return this.#toPlain();
    this.#parts.ex.fail(upstream('unscannable_encoding', detail));
    if (this.#headed) return this.#cutResponse(null);
    this.#headed = true;
    this.#stopReading();
    this.#parts.undecodable();
  }

  /** The decoders, outermost first, piped into one another; the last one's output goes to the scan. */
  #open(): void {
    this.#state = 'decoding';
    const stages = (this.#stages = this.#parts.decoders.list.map((d) => d()));
    for (const [i, s] of stages.entries()) {
      // Bytes fed to this stage: the raw body for the first, the output of the one before for the rest.
      let fed = 0;
      const before = i === 0 ? undefined : stages[i - 1];
      if (before !== undefined) {
        before.pipe(s);
        before.on('data', (d: Buffer) => (fed += d.length));
      }
      s.on('error', () => this.#unscannable('undecodable'));
      // A decoder ends at the end of its compressed data and drops whatever
      // follows (`deflate(…) + "apify_api_…"`): bytes that were never decoded
      // were never scanned, so the response is cut before any of them goes.
      s.on('end', () => {
        if ((s as unknown as zlib.Zlib).bytesWritten < (i === 0 ? this.#rawFed : fed)) this.#unscannable('trailing_bytes');
      });
    }
    (stages.at(-1) as Transform).on('data', (decoded: Buffer) => this.#onDecoded(decoded));
  }

  #onDecoded(decoded: Buffer): void {
    if (this.#state === 'stopped') return;
    const { limits, watch } = this.#parts;
    this.#decoded += decoded.length;
    // A bomb (6 KB of brotli that inflates to 4 GiB): what one response may make the gateway decode is bounded.
    if (this.#decoded > limits.maxDecodedBytes || (this.#decoded > RATIO_FROM && this.#decoded > limits.maxRatio * this.#rawFed))
      return this.#unscannable('decoded_limit');
    watch?.push(decoded);
    // Scanned for what it holds and where a possible secret starts; the decoded bytes themselves are not sent.
    this.#scan.pushTo(decoded, ignore);
    if (this.#scan.found !== null) this.#cutResponse(this.#scan.found);
  }

  /**
   * Everything written so far has been decoded and scanned once each stage,
   * in order, has processed a flush queued behind it.
   */
  #flushStages(then: () => void): void {
    let i = 0;
    const next = (): void => {
      if (this.#state !== 'decoding') return;
      const s = this.#stages[i++];
      if (s === undefined) then();
      else (s as unknown as zlib.Zlib).flush(() => setImmediate(next));
    };
    next();
  }

  /** Send the queued compressed bytes up to body offset `to`. */
  #releaseTo(to: number): void {
    if (to <= this.#released || this.#state === 'stopped') return;
    if (!this.#headOnce()) {
      this.#state = 'stopped';
      return;
    }
    const { proxyRes, res } = this.#parts;
    while (this.#released < to && this.#queue.length > 0) {
      const c = this.#queue[0] as Buffer;
      const n = Math.min(c.length, to - this.#released);
      send(proxyRes, res, n === c.length ? c : c.subarray(0, n));
      if (n === c.length) this.#queue.shift();
      else this.#queue[0] = c.subarray(n);
      this.#released += n;
    }
  }

  /**
   * After a chunk fully decoded and scanned: release every compressed byte whose whole decoded
   * content is scanned and clean and lies before the scan's held tail (a
   * possible start of a secret), and that is not itself a possible start of
   * a secret as it stands. What is held stays bounded by the longest
   * secret's spelling, decoded, whatever the body (a body of `a`s, each
   * chunk ending in a secret's first byte, goes out as it comes).
   */
  #releaseClean(): void {
    const offset = this.#frames === null ? this.#rawFed : this.#frames.safe;
    const to = cleanUpTo(this.#marks, offset, this.#decoded, this.#decoded - this.#scan.holding);
    if (to >= 0) this.#releaseTo(Math.min(to, this.#rawFed - this.#raw.holding));
    if (this.#rawFed - this.#released > MAX_HELD) this.#unscannable('held');
  }

  readonly #onData = (chunk: Buffer): void => {
    if (this.#state === 'stopped') return;
    const { proxyRes, res, ex } = this.#parts;
    ex.relayed(chunk.length);
    if (this.#state === 'plain') {
      this.#raw.pushTo(chunk, (out) => send(proxyRes, res, out));
      return;
    }
    if (this.#state === 'waiting') this.#open();
    // What goes is the raw scan's output: the same bytes, less a tail that
    // may start a secret (it goes with the next chunk), a secret masked. A
    // labelled body with a secret in its raw bytes is cut; a sniffed one
    // may be plain text after all, so it goes on, masked.
    const outs: Buffer[] = [];
    this.#raw.pushTo(chunk, (out) => outs.push(out));
    if (this.#raw.found !== null && this.#parts.sniffed === null) return this.#cutResponse(this.#raw.found);
    this.#queue.push(...outs);
    this.#frames?.push(chunk);
    proxyRes.pause();
    this.#rawFed += chunk.length;
    (this.#stages[0] as Transform).write(chunk);
    this.#flushStages(() => {
      this.#releaseClean();
      if (this.#state !== 'stopped' && !res.writableNeedDrain) proxyRes.resume();
    });
  };

  readonly #onEnd = (): void => {
    this.#ended = true;
    if (this.#state === 'stopped') return;
    if (this.#state === 'plain') return this.#finishPlain();
    if (this.#state === 'waiting') return this.#finish(null);
    (this.#stages.at(-1) as Transform).on('end', () => this.#decodersEnded());
    (this.#stages[0] as Transform).end();
  };

  /** The body ended and every decoder with it: what is left goes, or the response is cut. */
  #decodersEnded(): void {
    if (this.#state !== 'decoding') return;
    const { ex, onSecret, watch, sniffed } = this.#parts;
    const rest = this.#raw.end();
    if (this.#raw.found !== null && sniffed === null) return this.#cutResponse(this.#raw.found);
    if (rest !== null) this.#queue.push(rest);
    if (this.#raw.found !== null) onSecret(ex, this.#raw.found, false);
    if (watch !== null) watchEnded(ex, watch);
    // The body ended: a tail held as a possible start of a secret is none.
    this.#releaseTo(this.#rawFed);
    // Stopped there if the head could not go.
    if (!this.#stopped()) this.#finish(null);
  }
}

/**
 * Where compressed bytes may be released to, from the marks kept so far
 * (pairs of compressed offset and decoded bytes, updated in place): a new
 * mark (`offset`, `decoded`) is added (or replaces the last when nothing
 * more was decoded), and the furthest offset whose decoded bytes all lie
 * within `clean` is returned (-1: none yet); marks at or before it are
 * dropped. Pure: the release logic of the compressed relay, unit-tested.
 */
export function cleanUpTo(marks: number[], offset: number, decoded: number, clean: number): number {
  if (marks.length >= 2 && marks[marks.length - 1] === decoded) marks[marks.length - 2] = offset;
  else marks.push(offset, decoded);
  let to = -1;
  let k = 0;
  for (; k < marks.length && (marks[k + 1] as number) <= clean; k += 2) to = marks[k] as number;
  marks.splice(0, k);
  return to;
}
