// Each form a secret can take in a response (docs/security.md, "Each form a
// secret can take"). An upstream that echoes a secret rarely echoes it byte
// for byte: a URL percent-encodes some of its characters, JSON may escape
// any character as `\u00XX` and PHP's json_encode writes `/` as `\/`, HTML
// writes entities, a cookie or a token may carry it in base64, a log line
// may upper-case it, a Windows tool may write it in UTF-16. The scan reads a
// run of bytes the way such a decoder would (searchRun, prefixTail) and compares it with
// each secret case-folded, so every mix of these spellings, in either hex
// case, is one comparison. Pure: no I/O.

/** HTML's named references for the punctuation a secret or its base64 can hold. */
const NAMED: Readonly<Record<string, string>> = {
  sol: '/',
  equals: '=',
  plus: '+',
  lowbar: '_',
  UnderBar: '_',
  period: '.',
  colon: ':',
  commat: '@',
  dash: '-',
};
const LONGEST_NAME = Math.max(...Object.keys(NAMED).map((n) => n.length));

/** The most bytes one character's spelling takes (`&#x0000061;` in UTF-16): bounds what a scan may hold back. */
export const MAX_UNIT = 24;

/** A decoded character outside Latin-1: matches no secret. */
const NONE = 0xffff;

function hexValue(b: number): number {
  if (b >= 0x30 && b <= 0x39) return b - 0x30;
  const l = b | 0x20;
  return l >= 0x61 && l <= 0x66 ? l - 0x61 + 10 : -1;
}

function hexRun(buf: Uint8Array, at: number, count: number, end: number): number {
  let v = 0;
  for (let i = 0; i < count; i++) {
    if (at + i >= end) return -2; // cut short
    const h = hexValue(buf[at + i] as number);
    if (h < 0) return -1;
    v = v * 16 + h;
  }
  return v;
}

/**
 * One spelled character at `i`: [its code, its length in bytes], or null
 * when the bytes there are no escape (then the byte stands for itself).
 * `cut` is set when an escape starts here but the run ends before it does.
 */
function escapeAt(buf: Uint8Array, i: number, end: number): readonly [number, number] | 'cut' | null {
  const x = buf[i] as number;
  if (x === 0x25) {
    // %XX (RFC 3986 §2.1), either hex case.
    const v = hexRun(buf, i + 1, 2, end);
    return v >= 0 ? [v, 3] : v === -2 ? 'cut' : null;
  }
  if (x === 0x5c) {
    if (i + 1 >= end) return 'cut';
    const y = buf[i + 1] as number;
    // \u00XX (JSON, RFC 8259 §7) and \xXX (JavaScript, Python).
    if (y === 0x75) {
      const v = hexRun(buf, i + 2, 4, end);
      return v >= 0 ? [v, 6] : v === -2 ? 'cut' : null;
    }
    if (y === 0x78) {
      const v = hexRun(buf, i + 2, 2, end);
      return v >= 0 ? [v, 4] : v === -2 ? 'cut' : null;
    }
    // \/ (JSON's optional escape, PHP's default).
    if (y === 0x2f) return [0x2f, 2];
    return null;
  }
  if (x === 0x26) {
    // &#DDD; &#xHH; &name; (HTML).
    if (i + 1 >= end) return 'cut';
    if (buf[i + 1] === 0x23) {
      const hex = i + 2 < end && (buf[i + 2] === 0x78 || buf[i + 2] === 0x58);
      let j = i + (hex ? 3 : 2);
      let v = 0;
      const first = j;
      for (; j < end && j - first < 8; j++) {
        const b = buf[j] as number;
        const d = hex ? hexValue(b) : b >= 0x30 && b <= 0x39 ? b - 0x30 : -1;
        if (d < 0) break;
        v = v * (hex ? 16 : 10) + d;
      }
      if (j >= end) return j - first < 8 ? 'cut' : null;
      return buf[j] === 0x3b && j > first ? [v, j + 1 - i] : null;
    }
    // `;` at most one past the longest name.
    const last = i + 1 + LONGEST_NAME;
    let j = i + 1;
    for (; j < end && j <= last; j++) if (buf[j] === 0x3b) break;
    if (j >= end) return j <= last ? 'cut' : null;
    if (buf[j] !== 0x3b) return null;
    const named = NAMED[Buffer.from(buf.buffer, buf.byteOffset + i + 1, j - i - 1).toString('latin1')];
    return named === undefined ? null : [named.charCodeAt(0), j + 1 - i];
  }
  return null;
}

const fold = (c: number): number => (c >= 0x41 && c <= 0x5a ? c | 0x20 : c > 0xff ? NONE : c);
const isIntroducer = (x: number): boolean => x === 0x25 || x === 0x5c || x === 0x26;

/** A stretch of bytes made ready to read: NUL bytes dropped (UTF-16, either byte order), and where each byte left came from. */
interface Prepared {
  readonly src: Buffer;
  readonly place: (i: number) => number;
  /** No escape and no NUL: every byte stands for itself. */
  readonly plain: boolean;
}

/** Stands in the read text where two NULs in a row were: no spelling holds it, so nothing is matched across them. */
const BREAK = 0x0a;

function prepare(buf: Buffer, start: number, end: number): Prepared {
  const run = buf.subarray(start, end);
  const nul = run.indexOf(0) >= 0;
  if (!nul) return { src: run, place: (i) => start + i, plain: run.indexOf(0x25) < 0 && run.indexOf(0x5c) < 0 && run.indexOf(0x26) < 0 };
  // A single NUL beside a character is UTF-16's; two in a row are no part
  // of any spelling (UTF-16 text of a secret never holds them: that would
  // be a NUL character, or UTF-32, which is not read), so they end it.
  const offsets: number[] = [];
  const bytes: number[] = [];
  for (let i = 0; i < run.length; i++) {
    const b = run[i] as number;
    if (b !== 0) {
      offsets.push(start + i);
      bytes.push(b);
    } else if (i + 1 < run.length && run[i + 1] === 0) {
      offsets.push(start + i);
      bytes.push(BREAK);
      while (i + 1 < run.length && run[i + 1] === 0) i++;
    }
  }
  return { src: Buffer.from(bytes), place: (i) => offsets[i] as number, plain: false };
}

const NO = -1;
/** The run ended while the bytes so far still spell a start of the secret. */
const PREFIX = -2;

/**
 * Does a spelling of `s` (lower case) start at src[i]? Its end, NO, or
 * (with `atEnd`) PREFIX when the run ends inside it. Each character is
 * matched as itself or as any escape that reads back as it; both are tried
 * where both could (a secret holding `%`, `\` or `&`).
 */
function matchAt(src: Buffer, i: number, s: string, j: number, atEnd: boolean): number {
  for (;;) {
    if (j === s.length) return i;
    if (i >= src.length) return atEnd ? PREFIX : NO;
    const c = s.charCodeAt(j);
    const x = src[i] as number;
    if (isIntroducer(x)) {
      const e = escapeAt(src, i, src.length);
      if (e === 'cut' && atEnd) return PREFIX;
      if (e !== null && e !== 'cut' && fold(e[0]) === c) {
        if (fold(x) === c) {
          const r = matchAt(src, i + 1, s, j + 1, atEnd);
          if (r !== NO) return r;
        }
        i += e[1];
        j++;
        continue;
      }
    }
    if (fold(x) !== c) return NO;
    i++;
    j++;
  }
}

/** Secrets as a run is compared with them: lower case. */
export interface Folded {
  readonly folded: string;
}

/**
 * Every spelling of every secret in buf[start, end), as the reader of each
 * encoding would read it: `hit(form, from, to)` per occurrence, in bytes of
 * `buf`.
 */
export function searchRun<F extends Folded>(
  buf: Buffer,
  start: number,
  end: number,
  forms: readonly F[],
  hit: (form: F, from: number, to: number) => void,
): void {
  const { src, place, plain } = prepare(buf, start, end);
  if (plain) {
    // Most runs hold no escape: one native pass per secret.
    const text = src.toString('latin1').toLowerCase();
    for (const f of forms) {
      for (let i = text.indexOf(f.folded); i >= 0; i = text.indexOf(f.folded, i + 1)) hit(f, start + i, start + i + f.folded.length);
    }
    return;
  }
  const firsts = firstsOf(forms);
  for (let i = 0; i < src.length; i++) {
    // What the character here can read as, decoded once for every secret:
    // the byte itself, and the escape that starts here.
    const x = src[i] as number;
    const literal = fold(x);
    let escaped = -1;
    if (isIntroducer(x)) {
      const e = escapeAt(src, i, src.length);
      if (e !== null && e !== 'cut') escaped = fold(e[0]);
    }
    if (firsts[literal & 0xff] === 0 && (escaped < 0 || firsts[escaped & 0xff] === 0)) continue;
    for (const f of forms) {
      const c = f.folded.charCodeAt(0);
      if (literal !== c && escaped !== c) continue;
      const e = matchAt(src, i, f.folded, 0, false);
      if (e > i) hit(f, place(i), place(e - 1) + 1);
    }
  }
}

const FIRSTS = new WeakMap<readonly Folded[], Uint8Array>();
const INDEXES = new WeakMap<readonly Folded[], { readonly longest: number; readonly byFirst: ReadonlyArray<readonly Folded[] | undefined> }>();

/** The longest secret's length, and the secrets by their first (folded) character: per list of secrets, computed once. */
function firstByteTable(forms: readonly Folded[]): { readonly longest: number; readonly byFirst: ReadonlyArray<readonly Folded[] | undefined> } {
  let index = INDEXES.get(forms);
  if (index === undefined) {
    const byFirst: Array<Folded[] | undefined> = [];
    for (const f of forms) (byFirst[f.folded.charCodeAt(0)] ??= []).push(f);
    index = { longest: forms.reduce((m, f) => Math.max(m, f.folded.length), 0), byFirst };
    INDEXES.set(forms, index);
  }
  return index;
}

/** 1 for each (folded) first character of a secret, by its low byte: a quick no for most positions. */
function firstsOf(forms: readonly Folded[]): Uint8Array {
  let t = FIRSTS.get(forms);
  if (t === undefined) {
    t = new Uint8Array(256);
    for (const f of forms) t[f.folded.charCodeAt(0) & 0xff] = 1;
    FIRSTS.set(forms, t);
  }
  return t;
}

/**
 * What the character at src[i] can read as: the byte itself (folded), and
 * the escape starting there (folded), or -1; an escape the run ends inside
 * reads as anything (-2).
 */
function firstCodes(src: Buffer, i: number): readonly [number, number] {
  const x = src[i] as number;
  if (!isIntroducer(x)) return [fold(x), -1];
  const e = escapeAt(src, i, src.length);
  if (e === 'cut') return [fold(x), -2];
  return [fold(x), e === null ? -1 : fold(e[0])];
}

/**
 * Where the longest tail of buf[start, end) begins that spells a proper
 * prefix of some secret (an escape cut short by the end included), or -1.
 * `start` is where the run of alphabet bytes at the end begins.
 */
export function prefixTail(buf: Buffer, start: number, end: number, forms: readonly Folded[]): number {
  const { src, place, plain } = prepare(buf, start, end);
  const firsts = firstsOf(forms);
  if (plain) {
    // Each byte stands for itself here, so a proper prefix is shorter than
    // the longest secret: only the last so many bytes are read. Earliest
    // start first: the first hit is the longest tail.
    const { longest, byFirst } = firstByteTable(forms);
    const from = Math.max(0, src.length - longest + 1);
    for (let k = from; k < src.length; k++) {
      const candidates = byFirst[fold(src[k] as number)];
      if (candidates === undefined) continue;
      const rest = src.length - k;
      for (const f of candidates) {
        if (rest >= f.folded.length) continue;
        let j = 1;
        while (j < rest && fold(src[k + j] as number) === f.folded.charCodeAt(j)) j++;
        if (j === rest) return start + k;
      }
    }
    return -1;
  }
  for (let k = 0; k < src.length; k++) {
    const x = src[k] as number;
    if (!isIntroducer(x) && firsts[fold(x) & 0xff] === 0) continue;
    const [literal, escaped] = firstCodes(src, k);
    for (const f of forms) {
      const c = f.folded.charCodeAt(0);
      if (literal !== c && escaped !== c && escaped !== -2) continue;
      if (matchAt(src, k, f.folded, 0, true) === PREFIX) return place(k);
    }
  }
  return -1;
}

/** Every spelling of one (lower-case) character the decoder reads back as it. */
export function spellingsOf(c: string): string[] {
  const codes = c >= 'a' && c <= 'z' ? [c.charCodeAt(0), c.toUpperCase().charCodeAt(0)] : [c.charCodeAt(0)];
  const out: string[] = [];
  for (const code of codes) {
    out.push(String.fromCharCode(code), `&#${code};`);
    const hx = code.toString(16).padStart(2, '0');
    for (const h of new Set([hx, hx.toUpperCase()])) out.push(`%${h}`, `\\u00${h}`, `\\x${h}`, `&#x${h};`, `&#X${h};`);
  }
  if (c === '/') out.push('\\/');
  for (const [name, ch] of Object.entries(NAMED)) if (ch === c) out.push(`&${name};`);
  return out;
}

/** The most digits escapeAt reads in a numeric HTML entity (`&#00000097;`). */
const ENTITY_DIGITS = 8;

/**
 * Every byte string escapeAt (or a literal byte) reads back as the
 * lower-case character `c`: the literal, `%XX`, `\\u00XX`, `\\xXX`, `\\/`,
 * the decimal and hex HTML entities with every count of leading zeros
 * escapeAt accepts, and the named ones; hex digits and letters in lower case
 * (the window table folds case away). Exhaustive where spellingsOf is
 * representative: the window table must hold every window of every mix.
 */
export function everySpellingOf(c: string): string[] {
  const out = new Set<string>([c]);
  // A letter's escapes read back as it in either case (`&#65;` is `A`, which folds to `a`).
  for (const code of c >= 'a' && c <= 'z' ? [c.charCodeAt(0), c.toUpperCase().charCodeAt(0)] : [c.charCodeAt(0)]) {
    const hex = code.toString(16).padStart(2, '0');
    const dec = String(code);
    out.add(`%${hex}`).add(`\\u00${hex}`).add(`\\x${hex}`);
    for (let d = dec.length; d <= ENTITY_DIGITS; d++) out.add(`&#${dec.padStart(d, '0')};`);
    for (let d = hex.length; d <= ENTITY_DIGITS; d++) out.add(`&#x${hex.padStart(d, '0')};`);
  }
  if (c === '/') out.add('\\/');
  for (const [name, ch] of Object.entries(NAMED)) if (ch === c) out.add(`&${name};`);
  return [...out];
}

/** Each byte OR 0x20, as the scan folds a window (letters to lower case; some punctuation moves too, in both places alike). */
const foldText = (t: string): string => String.fromCharCode(...[...t].map((ch) => ch.charCodeAt(0) | 0x20));

/**
 * log2 of the window table's size in bits: 256 Kbit (32 KiB), about 4 %
 * full with one route's real secrets (some 11,000 windows). At 1 Mbit (1 %
 * full) the scan turned fewer windows into candidates, but in place its
 * reads missed the caches: a stream's own traffic evicts a table that size
 * between two reads (bench/README.md, "The scan's reads, per instruction").
 * egress.ts (sample) spells out the hash with these constants.
 */
export const WINDOW_BITS = 18;
/** Fibonacci hashing: the golden ratio's multiplier, the top WINDOW_BITS bits. */
export const WINDOW_MUL = 0x9e3779b1;
export const WINDOW_SHIFT = 32 - WINDOW_BITS;
/** A folded 4-byte window (little-endian) to its place in the window table. */
export const windowSlot = (w: number): number => Math.imul(w, WINDOW_MUL) >>> WINDOW_SHIFT;

/**
 * The scan's tables for a set of (lower-case) secrets (egress.ts):
 * - `alphabet`: 1 for every byte that can occur in a spelling of one (NUL
 *   too: UTF-16, either byte order);
 * - `windows`: a bit for every 4-byte window, folded, that can occur inside
 *   a spelling of one in any mix of spellings, hashed (windowSlot). A window
 *   with a NUL in it is not in the table: the scan treats every such window
 *   as a candidate, which covers UTF-16 (a NUL beside every byte) without
 *   every NUL pattern filling the table.
 */
export function spellingTables(secrets: readonly string[]): { readonly alphabet: Uint8Array; readonly windows: Uint32Array } {
  const alphabet = new Uint8Array(256);
  alphabet[0] = 1;
  const windows = new Uint32Array(1 << (WINDOW_BITS - 5));
  const cache = new Map<string, string[]>();
  const of = (c: string): string[] => {
    let s = cache.get(c);
    if (s === undefined) cache.set(c, (s = everySpellingOf(c).map(foldText)));
    return s;
  };
  for (const secret of secrets) {
    for (const ch of secret) {
      for (const u of [...spellingsOf(ch), ...everySpellingOf(ch)]) {
        for (let k = 0; k < u.length; k++) {
          const b = u.charCodeAt(k);
          alphabet[b] = 1;
          // The folded table has lost letter case; the alphabet must not.
          if (b >= 0x61 && b <= 0x7a) alphabet[b & ~0x20] = 1;
        }
      }
    }
    // The `n`-byte strings a spelling of secret[j…] can begin with (the window's part after the first spelling).
    const heads = new Map<number, Set<string>>();
    const headsOf = (j: number, n: number): Set<string> => {
      const key = j * 4 + n;
      let set = heads.get(key);
      if (set !== undefined) return set;
      set = new Set();
      if (n === 0) set.add('');
      else if (j < secret.length) {
        for (const u of of(secret[j] as string)) {
          if (u.length >= n) set.add(u.slice(0, n));
          else for (const rest of headsOf(j + 1, n - u.length)) set.add(u + rest);
        }
      }
      heads.set(key, set);
      return set;
    };
    for (let i = 0; i < secret.length; i++) {
      for (const u of of(secret[i] as string)) {
        for (let o = 0; o < u.length; o++) {
          const start = u.slice(o, o + 4);
          for (const rest of headsOf(i + 1, 4 - start.length)) {
            const w = start + rest;
            const word =
              ((w.charCodeAt(0) & 0xff) | ((w.charCodeAt(1) & 0xff) << 8) | ((w.charCodeAt(2) & 0xff) << 16) | ((w.charCodeAt(3) & 0xff) << 24)) >>> 0;
            const slot = windowSlot(word);
            windows[slot >>> 5] = (windows[slot >>> 5] as number) | (1 << (slot & 31));
          }
        }
      }
    }
  }
  return { alphabet, windows };
}

/**
 * The base64 of a secret inside longer base64 text, at each of the three
 * alignments it can start at, in the standard and the URL alphabet: only
 * the characters that depend on the secret's bytes alone (RFC 4648 §4, §5).
 */
export function base64Middles(secret: string): string[] {
  const bytes = Buffer.from(secret);
  const out = new Set<string>();
  for (let k = 0; k < 3; k++) {
    const b64 = Buffer.concat([Buffer.alloc(k), bytes])
      .toString('base64')
      .replace(/=+$/, '');
    // Character j holds bits [6j, 6j + 6): keep those past the k padding bytes and within the secret.
    const from = Math.ceil((8 * k) / 6);
    const to = Math.floor((8 * (k + bytes.length)) / 6);
    const middle = b64.slice(from, to);
    out.add(middle);
    out.add(middle.replace(/\+/g, '-').replace(/\//g, '_'));
  }
  return [...out];
}
