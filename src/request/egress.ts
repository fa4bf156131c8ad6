// The egress filter (docs/security.md, "Upstream secrets never reach a
// client"): every response header value and body byte from an upstream is
// scanned for each configured upstream secret in each form it can take
// (a token, a key, the SEO credential's base64 and its raw password). A match
// is replaced by as many `*` as it has bytes, so Content-Length and framing
// stay right. Pure: no I/O here; relay.ts drives it as the body streams.
import type { Route } from './routes.ts';
import { base64Middles, MAX_UNIT, prefixTail, searchRun, spellingsOf, spellingTables } from './spellings.ts';

/** Shorter values are not filtered (they would mask ordinary text); the start-up log names them. */
const MIN_SECRET_LENGTH = 8;
const MASK = 0x2a; // '*'

/** One form of one upstream secret, named by its route and form, never by its value. */
export interface SecretForm {
  readonly route: string;
  readonly form: string;
  readonly text: string;
  /** Lower-cased: what a decoded, case-folded run is compared with (spellings.ts). */
  readonly folded: string;
}

/**
 * The secrets to keep out of responses, with the tables the body scan reads,
 * built once per configuration (a 64 KiB pair table per response would cost
 * more than the scan).
 */
export class Secrets {
  readonly forms: readonly SecretForm[];
  /** 1 for every byte that occurs in some spelling of some secret. */
  readonly alphabet: Uint8Array;
  /** 1 for every pair of adjacent bytes in some spelling, indexed by `first | second << 8`. */
  readonly pairs: Uint8Array;
  /** The shortest secret's length less one: every spelling of one holds a pair starting at a multiple of it (less one). */
  readonly stride: number;
  /** The longest secret's length. */
  readonly longest: number;
  /** 1 for every byte that can begin a spelling of some secret (NUL too: UTF-16 big-endian). */
  readonly starts: Uint8Array;

  constructor(forms: readonly SecretForm[]) {
    this.forms = forms;
    const tables = spellingTables(forms.map((f) => f.folded));
    this.alphabet = tables.alphabet;
    this.pairs = tables.pairs;
    let shortest = Infinity;
    let longest = 0;
    for (const f of forms) {
      shortest = Math.min(shortest, f.folded.length);
      longest = Math.max(longest, f.folded.length);
    }
    this.stride = Number.isFinite(shortest) ? Math.max(1, shortest - 1) : 1;
    this.longest = longest;
    this.starts = new Uint8Array(256);
    this.starts[0] = 1;
    for (const f of forms) for (const u of spellingsOf(f.folded[0] as string)) this.starts[u.charCodeAt(0)] = 1;
  }

  get empty(): boolean {
    return this.forms.length === 0;
  }
}

/** A form of a secret, as the scan compares it. */
export function secretForm(route: string, form: string, text: string): SecretForm {
  return { route, form, text, folded: text.toLowerCase() };
}

/**
 * The secret forms of every configured route, longest first, each value
 * once: each form as configured and its base64 (spellings.ts); every other
 * spelling is read back by the scan itself.
 */
export function secretForms(routes: readonly Route[]): { readonly forms: readonly SecretForm[]; readonly tooShort: readonly string[] } {
  const forms: SecretForm[] = [];
  const tooShort: string[] = [];
  const seen = new Set<string>();
  const add = (route: string, form: string, value: string): void => {
    if (seen.has(value.toLowerCase())) return;
    seen.add(value.toLowerCase());
    forms.push(secretForm(route, form, value));
  };
  for (const r of routes) {
    for (const { form, value } of r.secretForms) {
      if (value.length < MIN_SECRET_LENGTH) {
        tooShort.push(`${r.name} ${form}`);
        continue;
      }
      add(r.name, form, value);
      for (const b64 of base64Middles(value)) add(r.name, `${form} base64`, b64);
    }
  }
  forms.sort((a, b) => b.folded.length - a.folded.length);
  return { forms, tooShort };
}

/**
 * Mask every secret in raw response headers (Node's flat [name, value, …]
 * list), in place, in every spelling the body scan reads. Returns the forms
 * found, or null (the common case: one scan of the joined values).
 */
export function maskHeaders(secrets: Secrets, raw: string[]): SecretForm[] | null {
  if (secrets.empty) return null;
  const joined = Buffer.from(raw.join('\n'), 'latin1');
  const scan = new BodyScan(secrets);
  const ranges = scan.matches(joined);
  if (ranges === null) return null;
  scan.apply(joined, ranges, joined.length);
  // Same lengths, so each value is where it was.
  let at = 0;
  for (let i = 0; i < raw.length; i++) {
    const n = (raw[i] as string).length;
    raw[i] = joined.toString('latin1', at, at + n);
    at += n + 1;
  }
  return scan.found;
}

/** One occurrence: [first byte, past its last byte, which form]; longest forms come first within a run. */
type Match = readonly [number, number, SecretForm];

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
    const buf = this.#held === null ? chunk : Buffer.concat([this.#held, chunk]);
    // Both on the bytes as they came: a match inside a possible secret start
    // (the password's base64 inside the Basic credential) must not break it.
    const ranges = this.matches(buf);
    const keep = this.#tail(buf);
    const cut = buf.length - keep;
    this.#held = keep === 0 ? null : Buffer.from(buf.subarray(cut));
    if (ranges === null) return keep === 0 ? buf : buf.subarray(0, cut);
    // The chunk may be a view of a buffer that is not ours to change.
    const out = Buffer.from(buf.subarray(0, cut));
    this.apply(out, ranges, cut);
    return out;
  }

  /**
   * Mask in `out` the matches that start before `cut` (the longest form
   * first, so one inside another is masked, not reported), and note their
   * forms. A match starting in the held tail is found again with the next
   * chunk; one that runs from before `cut` into it is masked in the held
   * bytes too, so it never leaves in part.
   */
  apply(out: Buffer, ranges: readonly Match[], cut: number): void {
    for (let r = 0; r < ranges.length; r++) {
      const [from, to, form] = ranges[r] as Match;
      if (from >= cut) continue;
      out.fill(MASK, from, Math.min(to, out.length));
      if (to > cut && this.#held !== null) this.#held.fill(MASK, 0, Math.min(to - cut, this.#held.length));
      let inside = false;
      for (let q = 0; q < r && !inside; q++) {
        const [f2, t2] = ranges[q] as Match;
        inside = f2 <= from && to <= t2;
      }
      if (!inside && (this.found === null || !this.found.includes(form))) (this.found ??= []).push(form);
    }
  }

  end(): Buffer | null {
    const rest = this.#held;
    this.#held = null;
    return rest;
  }

  /**
   * Every match in `buf`, found on the bytes as they came (two secrets
   * that overlap are both masked whole), or null.
   *
   * Every spelling of a secret is at least as long as the secret and longer
   * than `stride`, so an occurrence holds the two bytes at p, p+1 for some p
   * in stride-1, 2·stride-1, …: only those pairs are looked up (in a table
   * of the pairs some spelling can hold), and only around a pair that does
   * occur is the run of alphabet bytes decoded and searched. In binary data
   * (audio) few pairs are candidates and fewer runs are long enough, so a
   * 10 MiB stream costs a table lookup per `stride` bytes rather than a full
   * search per secret (bench/README.md, egress filter).
   */
  matches(buf: Buffer): Match[] | null {
    const { alphabet: A, pairs: P, stride: t } = this.#secrets;
    const n = buf.length - 1;
    // Pairs read two bytes at a time (little-endian: first | second << 8).
    const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    let ranges: Match[] | null = null;
    let searched = 0;
    for (let p = t - 1; p < n; p += t) {
      if (P[view.getUint16(p, true)] === 0 || p < searched) continue;
      // A pair from some spelling: search the run of alphabet bytes around it.
      let a = p;
      while (a > 0 && A[buf[a - 1] as number] === 1) a--;
      let b = p + 2;
      while (b <= n && A[buf[b] as number] === 1) b++;
      searched = b;
      if (b - a <= t) continue;
      ranges = this.#search(buf, a, b, ranges);
    }
    return ranges;
  }

  #search(buf: Buffer, a: number, b: number, ranges: Match[] | null): Match[] | null {
    let out = ranges;
    searchRun(buf, a, b, this.#secrets.forms, (f, from, to) => (out ??= []).push([from, to, f]));
    return out;
  }

  /**
   * The length of the longest tail of `buf` that is a spelling of a proper
   * prefix of some secret (an escape the chunk ends inside included), 0 for
   * none.
   */
  #tail(buf: Buffer): number {
    const n = buf.length;
    const { alphabet: A, longest, forms } = this.#secrets;
    // A tail that is a secret's start is made of alphabet bytes: most chunks end in one that is not.
    if (n === 0 || A[buf[n - 1] as number] === 0) return 0;
    let r = n - 1;
    // No spelling of a proper prefix is longer than this.
    const limit = Math.max(0, n - longest * MAX_UNIT);
    while (r > limit && A[buf[r - 1] as number] === 1) r--;
    // Only a byte that can begin a spelling of a secret can begin the tail: most runs hold none.
    let start = r;
    while (start < n && this.#secrets.starts[buf[start] as number] === 0) start++;
    if (start === n) return 0;
    const at = prefixTail(buf, start, n, forms);
    return at < 0 ? 0 : n - at;
  }
}
