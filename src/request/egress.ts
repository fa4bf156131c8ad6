// The egress filter (docs/security.md, "Upstream secrets never reach a
// client"): every response header value and body byte from an upstream is
// scanned for each configured upstream secret in each form it can take
// (a token, a key, the SEO credential's base64 and its raw password). A match
// is replaced by as many `*` as it has bytes, so Content-Length and framing
// stay right. Pure: no I/O here; relay.ts drives it as the body streams.
import type { Route } from './routes.ts';
import { base64Middles, MAX_UNIT, prefixTail, searchRun, spellingsOf, spellingTables, WINDOW_MUL, WINDOW_SHIFT } from './spellings.ts';

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
  /** A bit for every folded 4-byte window some spelling can hold (spellings.ts, windowSlot). */
  readonly windows: Uint32Array;
  /** The shortest secret's length less three: every spelling of one holds a whole window starting at a multiple of it. */
  readonly stride: number;
  /**
   * Windows in the table, four bytes apart, that any spelling holds around
   * the sampled one, at least: (shortest − 4) / 4, rounded down. A sampled
   * window whose neighbours fall short of it is no part of a secret.
   */
  readonly neighbours: number;
  /** The shortest secret's length. */
  readonly shortest: number;
  /** The longest secret's length. */
  readonly longest: number;
  /** 1 for every byte that can begin a spelling of some secret (NUL too: UTF-16 big-endian). */
  readonly starts: Uint8Array;
  /**
   * 0x80808080 when every spelling is ASCII, so that a window holding a byte
   * past 0x7f is no part of one (most windows of a binary body): the scan
   * passes it over without reading the window table. 0 when a secret holds
   * a character past ASCII (its UTF-8 bytes are past 0x7f).
   */
  readonly high: number;

  constructor(forms: readonly SecretForm[]) {
    this.forms = forms;
    const tables = spellingTables(forms.map((f) => f.folded));
    this.alphabet = tables.alphabet;
    this.windows = tables.windows;
    let shortest = Infinity;
    let longest = 0;
    for (const f of forms) {
      shortest = Math.min(shortest, f.folded.length);
      longest = Math.max(longest, f.folded.length);
    }
    // Secrets are at least MIN_SECRET_LENGTH long; a shorter one (a test's) only makes the scan read every window.
    this.shortest = Number.isFinite(shortest) ? shortest : 0;
    this.stride = Math.max(1, this.shortest - 3);
    this.neighbours = Math.max(1, Math.floor((this.shortest - 4) / 4));
    this.longest = longest;
    this.high = this.alphabet.subarray(0x80).includes(1) ? 0 : 0x80808080 | 0;
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
 * One table per upstream origin (scheme, host, port; docs/security.md, "What
 * each answer is scanned for"): the forms of every credential of every route
 * whose upstream has that origin. An upstream can reflect only what the
 * gateway sent it, so an answer is scanned for those and nothing else: the
 * voice provider's stream is not sampled at the stride of the SEO provider's
 * short password, which it never received. Routes sharing an origin share a
 * table. `filter` off: every table is empty.
 */
export function secretsByOrigin(routes: readonly Route[], filter: boolean): ReadonlyMap<string, Secrets> {
  const byOrigin = new Map<string, Route[]>();
  for (const r of routes) {
    const on = byOrigin.get(r.target.origin);
    if (on === undefined) byOrigin.set(r.target.origin, [r]);
    else on.push(r);
  }
  return new Map([...byOrigin].map(([origin, on]) => [origin, new Secrets(filter ? secretForms(on).forms : [])]));
}

/**
 * Mask every secret in raw response headers (Node's flat [name, value, …]
 * list), in place, in every spelling the body scan reads. Returns the forms
 * found, or null (the common case: one scan of the joined values).
 */
export function maskHeaders(secrets: Secrets, raw: string[]): SecretForm[] | null {
  if (secrets.empty) return null;
  // A name or value is scanned on its own first, as text, allocating
  // nothing: most are shorter than any secret, and the rest (a date, a
  // content type) hold no window a spelling could. Only a response where
  // one does is read in full, below.
  let suspect = false;
  for (let i = 0; i < raw.length && !suspect; i++) suspect = textSuspect(secrets, raw[i] as string);
  if (!suspect) return null;
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

/**
 * Whether `text` (read as Latin-1, as a header is written) could hold a
 * spelling of a secret: the body scan's sampled windows and their
 * confirmation, on the string itself.
 */
function textSuspect(secrets: Secrets, text: string): boolean {
  const last = text.length - 4;
  if (text.length < secrets.shortest || last < 0) return false;
  const { windows: W, stride, neighbours, alphabet: A } = secrets;
  // Plain functions, not closures: this runs on every header of every response.
  for (let p = 0; p <= last; p += stride) {
    if (((A[text.charCodeAt(p) & 0xff] as number) & (A[text.charCodeAt(p + 3) & 0xff] as number)) === 0 || !windowHit(W, textWord(text, p))) continue;
    let n = 1;
    for (let q = p - 4; q >= 0 && n < neighbours && windowHit(W, textWord(text, q)); q -= 4) n++;
    for (let q = p + 4; q <= last && n < neighbours && windowHit(W, textWord(text, q)); q += 4) n++;
    if (n >= neighbours) return true;
  }
  return false;
}

/** The 4-byte window of `text` at `p`, read as Latin-1 bytes, little-endian. */
function textWord(text: string, p: number): number {
  return (
    (text.charCodeAt(p) & 0xff) | ((text.charCodeAt(p + 1) & 0xff) << 8) | ((text.charCodeAt(p + 2) & 0xff) << 16) | ((text.charCodeAt(p + 3) & 0xff) << 24)
  );
}

/** A 4-byte window, folded: in the table, or holding a NUL (a NUL may sit anywhere in a UTF-16 spelling). */
function windowHit(windows: Uint32Array, raw: number): boolean {
  // Some byte is zero (the classic test: a borrow into the top bit of a byte that was 0).
  if (((raw - 0x01010101) & ~raw & 0x80808080) !== 0) return !twoNuls(raw);
  const slot = Math.imul(raw | 0x20202020, WINDOW_MUL) >>> WINDOW_SHIFT;
  return ((windows[slot >>> 5] as number) & (1 << (slot & 31))) !== 0;
}

/** The window at `p` of a body (windowHit). */
function candidate(view: DataView, p: number, windows: Uint32Array): boolean {
  return windowHit(windows, view.getInt32(p, true));
}

/**
 * Two NUL bytes side by side in a window: no spelling holds them (a UTF-16
 * one has one NUL beside each character), so no secret is there. A body of
 * zeros (silence in audio, a decompression bomb) is then turned away by the
 * sampled windows alone instead of being decoded run by run.
 */
function twoNuls(raw: number): boolean {
  // Exactly the zero bytes, each as its top bit (no borrow between bytes).
  const zero = ~(((raw & 0x7f7f7f7f) + 0x7f7f7f7f) | raw | 0x7f7f7f7f);
  return (zero & (zero >>> 8)) !== 0;
}

/** At least `neighbours` candidate windows in a row, four bytes apart, through the one at `p` (within 0…last). */
function confirmed(view: DataView, p: number, last: number, windows: Uint32Array, neighbours: number): boolean {
  let n = 1;
  for (let q = p - 4; q >= 0 && n < neighbours && candidate(view, q, windows); q -= 4) n++;
  for (let q = p + 4; q <= last && n < neighbours && candidate(view, q, windows); q += 4) n++;
  return n >= neighbours;
}

/**
 * The loop of the whole filter: the first sampled window from `from` on,
 * `stride` apart up to `to`, that a spelling could hold, or -1. A function
 * of its own over typed arrays only, so its optimised code depends on no
 * object's shape (inside `BodyScan.matches`, a change of the scan's own
 * shape threw the optimised loop away and it ran unoptimised in the
 * gateway), and with no call and no store in it: the caller handles a
 * candidate and calls again past it. Candidates are rare in honest bodies.
 *
 * Each window pays a read, one test and, for an ASCII window, the table.
 * A window with a byte past 0x7f is passed over first (`high`): in random
 * bytes 15 windows in 16, which then never read the table, whose lines an
 * audio stream's other traffic evicts between two reads (in place, a read
 * that missed cost more than the other 15 windows together). The hash is
 * windowSlot spelled out with its constants (spellings.ts): called, or with
 * the imported constants, V8 kept them on the stack and the loop ran slower.
 * A window that holds a NUL is a candidate too (UTF-16), unless it holds two
 * side by side, which no spelling does: silence in audio, or a bomb of
 * zeros, is passed over here.
 */
function sample(view: DataView, W: Uint32Array, from: number, to: number, stride: number, high: number): number {
  for (let p = from; p <= to; p += stride) {
    const raw = view.getInt32(p, true);
    if ((raw & high) !== 0) continue;
    const slot = Math.imul(raw | 0x20202020, 0x9e3779b1) >>> 14;
    const nul = (raw - 0x01010101) & ~raw & 0x80808080;
    if ((((W[slot >>> 5] as number) & (1 << slot)) | nul) === 0) continue;
    // twoNuls, spelled out for the same reason.
    const zero = ~(((raw & 0x7f7f7f7f) + 0x7f7f7f7f) | raw | 0x7f7f7f7f);
    if (nul === 0 || (zero & (zero >>> 8)) === 0) return p;
  }
  return -1;
}

/** One occurrence: [first byte, past its last byte, which form]; longest forms come first within a run. */
type Match = readonly [number, number, SecretForm];

/**
 * A streaming scan of one body. `push` returns the bytes that may leave now
 * with every complete secret masked; a tail that could be the start of a
 * secret is held back until the next chunk says (at most the longest
 * secret's length less one), so a secret split across chunks is masked too.
 * `end` returns what is still held, scanned as it is: the body ended, so no
 * longer spelling can complete it, but it may hold a whole shorter one.
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
   * What push returns, written to `write` in one or two parts, without
   * copying the chunk. While a possible start of a secret is held, push
   * scans the held bytes and the chunk as one buffer, which copies the
   * chunk; here the chunk is scanned where it lies, and the held bytes with
   * the chunk's first bytes as a small joint: a secret that begins in the
   * held bytes ends within `seam` bytes of the chunk (no spelling is longer),
   * and one that begins in the chunk lies inside it. When neither holds a
   * match (every honest chunk), the held bytes and the chunk go out as two
   * parts. A body that ends every chunk in a possible start (text of `a`s,
   * each one the start of `apify_api_…`) otherwise had every chunk copied,
   * and the copies, memory outside the heap, brought full collections that
   * held the event loop (scripts/hostile-soak, "10 held body"). When there
   * is a match, push does it all again the simple way: secrets are rare.
   */
  pushTo(chunk: Buffer, write: (out: Buffer) => void): void {
    const held = this.#held;
    const seam = this.#secrets.longest * MAX_UNIT;
    if (held === null || chunk.length <= 2 * seam || this.#clean(held, chunk, seam) === false) {
      const out = this.push(chunk);
      if (out.length > 0) write(out);
      return;
    }
    // Nothing to mask: the tail is the chunk's own (it is longer than any tail can be).
    const keep = this.#tail(chunk);
    const cut = chunk.length - keep;
    this.#held = keep === 0 ? null : Buffer.from(chunk.subarray(cut));
    write(held);
    if (cut > 0) write(cut === chunk.length ? chunk : chunk.subarray(0, cut));
  }

  /** Whether `held` followed by `chunk` holds no match: the joint of the two, and the chunk where it lies. */
  #clean(held: Buffer, chunk: Buffer, seam: number): boolean {
    const joint = Buffer.concat([held, chunk.subarray(0, seam)]);
    const early = this.matches(joint);
    // A match that begins in the chunk is the chunk's scan's to find.
    if (early !== null && early.some(([from]) => from < held.length)) return false;
    return this.matches(chunk) === null;
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
    // The tail was held as the possible start of a longer spelling, but it
    // may hold a whole shorter one: a secret that is the start of another
    // (two tokens, one a prefix of the other). The body ended, so what the
    // tail holds is scanned as it is, and masked.
    if (rest !== null) {
      const ranges = this.matches(rest);
      if (ranges !== null) this.apply(rest, ranges, rest.length);
    }
    return rest;
  }

  /**
   * Every match in `buf`, found on the bytes as they came (two secrets
   * that overlap are both masked whole), or null.
   *
   * Every spelling of a secret is at least as long as the secret, so an
   * occurrence holds a whole 4-byte window starting at some multiple of
   * `stride` (the shortest secret less three): only those windows are read,
   * case-folded (each byte OR 0x20), and looked up in a table of the windows
   * any spelling can hold (spellings.ts). A window that is there, or that
   * holds a NUL (UTF-16), is confirmed by its neighbours four bytes apart,
   * of which an occurrence holds at least `neighbours` in a row; only then
   * is the run of alphabet bytes around it decoded and searched, by the
   * reader of every spelling (searchRun). Text costs one read and one table
   * read every `stride` bytes; binary mostly the read alone (sample, and
   * bench/README.md, "The scan's reads, per instruction").
   */
  matches(buf: Buffer): Match[] | null {
    const s = this.#secrets;
    const last = buf.length - 4;
    if (last < 0 || buf.length < s.shortest) return s.shortest < 4 && buf.length > 0 ? this.#search(buf, 0, buf.length, null) : null;
    // Chunks arrive as Buffers of several hidden classes (read from a socket,
    // concatenated, sliced); read through views of one class each, or the
    // loop below is deoptimised again and again ("wrong map") and runs in the
    // interpreter, five times slower.
    const bytes = new Uint8Array(buf.buffer, buf.byteOffset, buf.byteLength);
    const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
    const A = s.alphabet;
    const W = s.windows;
    const stride = s.stride;
    this.#ranges = null;
    this.#searched = 0;
    for (let p = sample(view, W, 0, last, stride, s.high); p >= 0; p = sample(view, W, p + stride, last, stride, s.high)) {
      // A window whose first or last byte no spelling holds is no part of one.
      if (((A[bytes[p] as number] as number) & (A[bytes[p + 3] as number] as number)) !== 0) this.#candidate(buf, bytes, view, p, last);
    }
    const ranges = this.#ranges;
    this.#ranges = null;
    return ranges;
  }

  /** Matches found so far by the running `matches`, and where its searches have reached. */
  #ranges: Match[] | null = null;
  #searched = 0;

  /** A sampled window that a spelling could hold: confirmed by its neighbours, then the run of alphabet bytes around it decoded and searched. */
  #candidate(buf: Buffer, bytes: Uint8Array, view: DataView, p: number, last: number): void {
    const s = this.#secrets;
    if (p < this.#searched || (s.neighbours > 1 && !confirmed(view, p, last, s.windows, s.neighbours))) return;
    const A = s.alphabet;
    let a = p;
    while (a > 0 && A[bytes[a - 1] as number] === 1 && !(bytes[a - 1] === 0 && bytes[a - 2] === 0)) a--;
    let b = p;
    while (b < bytes.length && A[bytes[b] as number] === 1 && !(bytes[b] === 0 && bytes[b + 1] === 0)) b++;
    this.#searched = b;
    if (b - a >= s.shortest) this.#ranges = this.#search(buf, a, b, this.#ranges);
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
    while (r > limit && A[buf[r - 1] as number] === 1 && !(buf[r - 1] === 0 && buf[r - 2] === 0)) r--;
    // Only a byte that can begin a spelling of a secret can begin the tail: most runs hold none.
    let start = r;
    while (start < n && this.#secrets.starts[buf[start] as number] === 0) start++;
    if (start === n) return 0;
    const at = prefixTail(buf, start, n, forms);
    return at < 0 ? 0 : n - at;
  }
}
