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
import type { Exchange } from './exchange.ts';
import { upstream } from './outcome.ts';
import { plausible, type TopLevelField } from './usage/cost.ts';

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

/**
 * The decoders for a Content-Encoding value, outermost first: [] for none or
 * identity, null for a coding the filter cannot read (the caller refuses it).
 */
/** The most content codings a response may stack (docs/security.md); more is a 502. */
export const MAX_CODINGS = 3;

export function decodersFor(encoding: string | undefined): Decoder[] | null {
  if (encoding === undefined) return [];
  const codings = encoding
    .split(',')
    .map((c) => c.trim().toLowerCase())
    .filter((c) => c !== '' && c !== 'identity');
  // Every coding is one more decoder over the whole body: a response that
  // stacks them (`gzip,gzip,…` three thousand times) is work an upstream
  // forces on the gateway. No real upstream applies more than two.
  if (codings.length > MAX_CODINGS) return null;
  const out: Decoder[] = [];
  // Codings are listed in the order they were applied (RFC 9110 §8.4): undo the last first.
  for (const c of codings.reverse()) {
    const d = DECODERS[c];
    if (d === undefined) return null;
    out.push(d);
  }
  return out;
}

/** The body ended: what its top-level cost field said. */
function costRead(ex: Exchange, cost: TopLevelField): void {
  cost.end();
  const checked = plausible(cost.value ?? 0, ex.route?.cost?.max ?? Infinity);
  ex.cost = checked.value;
  ex.costBad = cost.bad || checked.bad;
}

/** The upstream's declared body length, or -1 (none, or not a plain number). */
function contentLength(res: IncomingMessage): number {
  const v = res.headers['content-length'];
  return v !== undefined && /^\d{1,15}$/.test(v) ? Number(v) : -1;
}

function send(proxyRes: IncomingMessage, res: ServerResponse, out: Buffer): void {
  if (out.length > 0 && !res.write(out)) {
    proxyRes.pause();
    res.once('drain', () => proxyRes.resume());
  }
}

/** Relay a body that is not compressed, masking secrets as it streams (no secrets: filter off). */
export function relayPlain(proxyRes: IncomingMessage, res: ServerResponse, ex: Exchange, secrets: Secrets, onSecret: OnSecret, cost: TopLevelField | null): void {
  const whole = contentLength(proxyRes);
  const scan = secrets.empty ? null : new BodyScan(secrets);
  proxyRes.on('data', (chunk: Buffer) => {
    ex.bytesOut += chunk.length;
    // Watched on its way, never held: the cost reader only reads.
    cost?.push(chunk);
    const out = scan === null ? chunk : scan.push(chunk);
    if (out.length === whole) {
      res.end(out);
      return;
    }
    send(proxyRes, res, out);
  });
  proxyRes.on('end', () => {
    if (cost !== null) costRead(ex, cost);
    const rest = scan?.end() ?? null;
    if (scan !== null && scan.found !== null) onSecret(ex, scan.found, false);
    if (!res.writableEnded) res.end(rest ?? undefined);
  });
}

/** Relay a compressed body, scanning a decompressed copy (see the header comment). */
export function relayCompressed(
  proxyRes: IncomingMessage,
  res: ServerResponse,
  ex: Exchange,
  secrets: Secrets,
  decoders: readonly Decoder[],
  onSecret: OnSecret,
  cost: TopLevelField | null,
  head: () => boolean,
  undecodable: () => void,
): void {
  /** The status and headers went out (with the first bytes released, or at the end). */
  let headed = false;
  const headOnce = (): boolean => {
    if (headed) return true;
    headed = true;
    return head();
  };
  const scan = new BodyScan(secrets);
  // The compressed bytes themselves, as they are: what decoders skip (gzip's
  // FNAME, FCOMMENT and FEXTRA, zstd's skippable frames) and literals a
  // decoder stores raw are sent to the client as they are, secret and all.
  const raw = new BodyScan(secrets);
  let stages: Transform[] = [];
  /** Bytes given to each stage: what it must have consumed by its end. */
  let fed: number[] = [];
  let held: Buffer[] = [];
  let cut = false;
  const stop = (found: readonly SecretForm[] | null): void => {
    if (cut) return;
    cut = true;
    held = [];
    for (const s of stages) s.destroy();
    if (found !== null) onSecret(ex, found, true);
    proxyRes.destroy();
    res.destroy();
  };
  const open = (): void => {
    stages = decoders.map((d) => d());
    fed = stages.map(() => 0);
    for (let i = 1; i < stages.length; i++) {
      (stages[i - 1] as Transform).pipe(stages[i] as Transform);
      (stages[i - 1] as Transform).on('data', (d: Buffer) => (fed[i] = (fed[i] as number) + d.length));
    }
    // Undecodable, so unscannable: not relayed. Nothing sent yet: a 502 says so.
    const refuse = (): void => {
      if (headed) return stop(null);
      headed = true;
      cut = true;
      held = [];
      for (const t of stages) t.destroy();
      proxyRes.destroy();
      undecodable();
    };
    for (const [i, s] of stages.entries()) {
      s.on('error', refuse);
      // A decoder ends at the end of its compressed data and drops whatever
      // follows (`deflate(…) + "apify_api_…"`): bytes that were never decoded
      // were never scanned, so the response is cut before any of them goes.
      s.on('end', () => {
        if ((s as unknown as zlib.Zlib).bytesWritten >= (fed[i] as number)) return;
        ex.fail(upstream('unscannable_encoding', 'trailing_bytes'));
        refuse();
      });
    }
    (stages.at(-1) as Transform).on('data', (plain: Buffer) => {
      cost?.push(plain);
      scan.push(plain);
      if (scan.found !== null) stop(scan.found);
    });
  };
  // Everything written so far has been decoded and scanned once each stage,
  // in order, has processed a flush queued behind it.
  const settle = (then: () => void): void => {
    let i = 0;
    const next = (): void => {
      if (cut) return;
      const s = stages[i++];
      if (s === undefined) then();
      else (s as unknown as zlib.Zlib).flush(() => setImmediate(next));
    };
    next();
  };
  const release = (): void => {
    if (held.length === 0) return;
    if (!headOnce()) {
      cut = true;
      return;
    }
    for (const c of held) send(proxyRes, res, c);
    held = [];
  };
  proxyRes.on('data', (chunk: Buffer) => {
    if (cut) return;
    ex.bytesOut += chunk.length;
    if (stages.length === 0) open();
    held.push(chunk);
    raw.push(chunk);
    if (raw.found !== null) return stop(raw.found);
    proxyRes.pause();
    fed[0] = (fed[0] as number) + chunk.length;
    (stages[0] as Transform).write(chunk);
    settle(() => {
      // A partial secret at the end of what decoded so far, or of the raw bytes: keep the chunks until the next one says.
      if (scan.holding === 0 && raw.holding === 0) release();
      if (!res.writableNeedDrain) proxyRes.resume();
    });
  });
  proxyRes.on('end', () => {
    if (cut) return;
    if (stages.length === 0) {
      if (headOnce() && !res.writableEnded) res.end();
      return;
    }
    (stages.at(-1) as Transform).on('end', () => {
      if (cut) return;
      raw.end();
      if (raw.found !== null) return stop(raw.found);
      if (cost !== null) costRead(ex, cost);
      release();
      if (!cut && headOnce() && !res.writableEnded) res.end();
    });
    (stages[0] as Transform).end();
  });
}
