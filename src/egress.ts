// The egress filter (docs/security.md, "Upstream secrets never reach a
// client"): every response header value and body byte from an upstream is
// scanned for each configured upstream secret in each form it can take
// (a token, a key, the SEO credential's base64 and its raw password). A match
// is replaced by as many `*` as it has bytes, so Content-Length and framing
// stay right. Pure: no I/O here; relay.ts drives it as the body streams.
import type { Route } from './routes.ts';

/** Shorter values are not filtered (they would mask ordinary text); the start-up log names them. */
const MIN_SECRET_LENGTH = 8;
const MASK = 0x2a; // '*'

/** One form of one upstream secret, named by its route and form, never by its value. */
export interface SecretForm {
  readonly route: string;
  readonly form: string;
  readonly text: string;
  readonly bytes: Buffer;
}

/**
 * The secrets to keep out of responses, with the tables the body scan reads,
 * built once per configuration (a 64 KiB pair table per response would cost
 * more than the scan).
 */
export class Secrets {
  readonly forms: readonly SecretForm[];
  /** 1 for every byte that occurs in some secret. */
  readonly alphabet: Uint8Array;
  /** 1 for every pair of adjacent bytes in some secret, indexed by `first | second << 8`. */
  readonly pairs: Uint8Array;
  /** The shortest secret's length less one: every occurrence holds a pair starting at a multiple of it (less one). */
  readonly stride: number;

  constructor(forms: readonly SecretForm[]) {
    this.forms = forms;
    this.alphabet = new Uint8Array(256);
    this.pairs = new Uint8Array(65536);
    let shortest = Infinity;
    for (const f of forms) {
      const b = f.bytes;
      for (let i = 0; i < b.length; i++) {
        this.alphabet[b[i] as number] = 1;
        if (i + 1 < b.length) this.pairs[(b[i] as number) | ((b[i + 1] as number) << 8)] = 1;
      }
      shortest = Math.min(shortest, b.length);
    }
    this.stride = Number.isFinite(shortest) ? Math.max(1, shortest - 1) : 1;
  }

  get empty(): boolean {
    return this.forms.length === 0;
  }
}

/** The secret forms of every configured route, longest first, each value once. */
export function secretForms(routes: readonly Route[]): { readonly forms: readonly SecretForm[]; readonly tooShort: readonly string[] } {
  const forms: SecretForm[] = [];
  const tooShort: string[] = [];
  const seen = new Set<string>();
  for (const r of routes) {
    for (const { form, value } of r.secretForms) {
      if (value.length < MIN_SECRET_LENGTH) tooShort.push(`${r.name} ${form}`);
      else if (!seen.has(value)) {
        seen.add(value);
        forms.push({ route: r.name, form, text: value, bytes: Buffer.from(value) });
      }
    }
  }
  forms.sort((a, b) => b.bytes.length - a.bytes.length);
  return { forms, tooShort };
}

/**
 * Mask every secret in raw response headers (Node's flat [name, value, …]
 * list), in place. Returns the forms found, or null (the common case, one
 * scan of the joined values per secret).
 */
export function maskHeaders(forms: readonly SecretForm[], raw: string[]): SecretForm[] | null {
  if (forms.length === 0) return null;
  const joined = raw.join('\n');
  let found: SecretForm[] | null = null;
  for (const f of forms) if (joined.includes(f.text)) (found ??= []).push(f);
  if (found === null) return null;
  const stars = (n: number): string => '*'.repeat(n);
  for (let i = 0; i < raw.length; i++) {
    let v = raw[i] as string;
    for (const f of found) if (v.includes(f.text)) v = v.split(f.text).join(stars(f.text.length));
    raw[i] = v;
  }
  return found;
}

/**
 * A streaming scan of one body. `push` returns the bytes that may leave now
 * with every complete secret masked; a tail that could be the start of a
 * secret is held back until the next chunk says (at most the longest
 * secret's length less one), so a secret split across chunks is masked too.
 * `end` returns what is still held: the body ended, so it is no secret.
 */
export class BodyScan {
  readonly #secrets: Secrets;
  #held: Buffer | null = null;
  /** Forms found so far in this body. */
  found: SecretForm[] | null = null;

  constructor(secrets: Secrets) {
    this.#secrets = secrets;
  }

  /** Bytes held back: a tail that may be the start of a secret. */
  get holding(): number {
    return this.#held?.length ?? 0;
  }

  push(chunk: Buffer): Buffer {
    let buf = this.#held === null ? chunk : Buffer.concat([this.#held, chunk]);
    const ranges = this.#matches(buf);
    if (ranges !== null) {
      // The chunk may be a view of a buffer that is not ours to change.
      if (this.#held === null) buf = Buffer.from(buf);
      for (let r = 0; r < ranges.length; r += 2) buf.fill(MASK, ranges[r] as number, (ranges[r] as number) + (ranges[r + 1] as number));
    }
    const keep = this.#tail(buf);
    this.#held = keep === 0 ? null : Buffer.from(buf.subarray(buf.length - keep));
    return keep === 0 ? buf : buf.subarray(0, buf.length - keep);
  }

  end(): Buffer | null {
    const rest = this.#held;
    this.#held = null;
    return rest;
  }

  /**
   * Every match in `buf` as (start, length) pairs, found on the unmasked
   * bytes (two secrets that overlap are both masked whole), or null.
   *
   * Every secret is longer than `stride`, so an occurrence holds the two
   * bytes at p, p+1 for some p in stride-1, 2·stride-1, …: only those pairs
   * are looked up (in a table of the pairs that occur in some secret), and
   * only around a pair that does occur is the run of alphabet bytes
   * searched. In binary data (audio) about one pair in 400 is a candidate,
   * so a 10 MiB stream costs a table lookup per `stride` bytes rather than a
   * full search per secret (bench/README.md, egress filter).
   */
  #matches(buf: Buffer): number[] | null {
    const { alphabet: A, pairs: P, stride: t, forms } = this.#secrets;
    const n = buf.length - 1;
    // Pairs read two bytes at a time (little-endian: first | second << 8).
    const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    let ranges: number[] | null = null;
    let searched = 0;
    for (let p = t - 1; p < n; p += t) {
      if (P[view.getUint16(p, true)] === 0 || p < searched) continue;
      // A pair from some secret: search the run of alphabet bytes around it.
      let a = p;
      while (a > 0 && A[buf[a - 1] as number] === 1) a--;
      let b = p + 2;
      while (b <= n && A[buf[b] as number] === 1) b++;
      searched = b;
      if (b - a <= t) continue;
      const run = buf.subarray(a, b);
      for (const f of forms) {
        for (let i = run.indexOf(f.bytes); i >= 0; i = run.indexOf(f.bytes, i + 1)) {
          (ranges ??= []).push(a + i, f.bytes.length);
          if (this.found === null || !this.found.includes(f)) (this.found ??= []).push(f);
        }
      }
    }
    return ranges;
  }

  /** The length of the longest tail of `buf` that is a proper prefix of some secret, 0 for none. */
  #tail(buf: Buffer): number {
    const n = buf.length;
    // A tail that is a secret's start is made of alphabet bytes: most chunks end in one that is not.
    if (n === 0 || this.#secrets.alphabet[buf[n - 1] as number] === 0) return 0;
    let keep = 0;
    for (const f of this.#secrets.forms) {
      const s = f.bytes;
      const first = s[0] as number;
      // Earliest start first: the first hit is the longest tail for this secret.
      for (let p = Math.max(0, n - s.length + 1); p < n - keep; p++) {
        if (buf[p] === first && buf.compare(s, 0, n - p, p, n) === 0) {
          keep = n - p;
          break;
        }
      }
    }
    return keep;
  }
}
