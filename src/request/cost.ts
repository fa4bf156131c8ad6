// What a response says as it streams past, read in one place: what the call
// cost (docs/limits.md), from a header or from a top-level number field of a
// JSON body found by a small incremental scanner (`TopLevelField`), or which
// scraper run a run-start started (`RunReader`; the run's cost is the
// settler's to ask for, ledger/runs.ts). It only watches the bytes on their way to the
// client — it never holds or delays one — survives any chunk boundary, and
// ignores fields of the same name deeper down (each task of an SEO answer
// carries its own `cost`). Pure: it returns what it read; the request path
// records it.
import type { IncomingHttpHeaders } from 'node:http';
import type { UpstreamSpec } from './routes.ts';
import { runOf } from '../ledger/runs.ts';

/** A reported cost as counted (0 when absent or implausible), and whether the report was unusable. */
export interface Cost {
  readonly value: number;
  readonly bad: boolean;
  /** The upstream reported a usable figure: only such a cost teaches a budget's estimate (docs/limits.md). */
  readonly seen: boolean;
}

/** A header's cost: plain decimal digits only (Number() would take `0x10` as 16, `1e308`, `Infinity`). */
const DECIMAL = /^\d{1,15}(?:\.\d{1,15})?$/;

/** The first of `names` present as a plain non-negative decimal number, or null (absent or not one). */
function headerCost(headers: IncomingHttpHeaders, names: readonly string[]): { value: number | null; bad: boolean } {
  for (const name of names) {
    const v = headers[name];
    if (typeof v !== 'string') continue;
    const text = v.trim();
    return DECIMAL.test(text) ? { value: Number(text), bad: false } : { value: null, bad: true };
  }
  return { value: null, bad: false };
}

/** `value` as the call's cost, or 0 and `bad` when it is more than one call of the route can cost. */
export function plausible(value: number, max: number): { value: number; bad: boolean } {
  return Number.isFinite(value) && value >= 0 && value <= max ? { value, bad: false } : { value: 0, bad: true };
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const COLON = 0x3a;
const NUMBER = /^-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?$/;
const KEY_MAX = 64;

/** Finds `"field": <number>` at the top level of a streamed JSON object. */
export class TopLevelField {
  readonly #field: string;
  #depth = 0;
  #inString = false;
  #escaped = false;
  /** The string being read, when it may be a top-level key (null: not collecting). */
  #string: string | null = null;
  #lastString: string | null = null;
  /** After `"field":` at the top level: the value's text so far. */
  #value: string | null = null;
  #done = false;
  /** The field's number once read; null while not (yet) found. */
  value: number | null = null;
  /** The field was there but not a non-negative number. */
  bad = false;

  constructor(field: string) {
    this.#field = field;
  }

  push(chunk: Buffer): void {
    if (this.#done) return;
    // The state in locals for the walk, written back after it: a field read
    // and write per byte, and a Set lookup per bracket, made the reader cost
    // 11 ns a byte on a body whose field comes last, against 6 now
    // (bench/README.md, "What the scan still costs in place"); a return that
    // ends the reading needs no write-back.
    let depth = this.#depth;
    let inString = this.#inString;
    let escaped = this.#escaped;
    let string = this.#string;
    let lastString = this.#lastString;
    let value = this.#value;
    const n = chunk.length;
    for (let i = 0; i < n; i++) {
      const c = chunk[i] as number;
      if (value !== null) {
        // Reading the value: a number ends at the first byte that cannot be in one.
        if ((c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x2b || c === 0x2e || c === 0x65 || c === 0x45) {
          if (value.length > 40) return this.#finish(value);
          value += String.fromCharCode(c);
          continue;
        }
        if (value === '' && (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d)) continue;
        return this.#finish(value);
      }
      if (inString) {
        if (escaped) escaped = false;
        else if (c === BACKSLASH) escaped = true;
        else if (c === QUOTE) {
          inString = false;
          lastString = string;
          string = null;
          continue;
        }
        if (string !== null) string = string.length < KEY_MAX ? string + String.fromCharCode(c) : null;
        continue;
      }
      if (c === QUOTE) {
        inString = true;
        string = depth === 1 ? '' : null;
        lastString = null;
      } else if (c === 0x7b || c === 0x5b) {
        // The body must be an object for a top-level field to exist.
        if (depth === 0 && c !== 0x7b) return void (this.#done = true);
        depth++;
        lastString = null;
      } else if (c === 0x7d || c === 0x5d) {
        depth--;
        if (depth <= 0) return void (this.#done = true);
      } else if (c === COLON && depth === 1 && lastString === this.#field) {
        value = '';
      } else if (c !== 0x20 && c !== 0x09 && c !== 0x0a && c !== 0x0d) {
        lastString = null;
      }
    }
    this.#depth = depth;
    this.#inString = inString;
    this.#escaped = escaped;
    this.#string = string;
    this.#lastString = lastString;
    this.#value = value;
  }

  /** The body ended: a number still being read is complete. */
  end(): void {
    if (this.#value !== null) this.#finish(this.#value);
    this.#done = true;
  }

  #finish(text: string): void {
    this.#value = null;
    this.#done = true;
    const n = NUMBER.test(text) ? Number(text) : Number.NaN;
    if (Number.isFinite(n) && n >= 0) this.value = n;
    else this.bad = true;
  }
}

/**
 * What the call cost, as the route's upstream (`how`) reports it: from a
 * header now (null when it reports none there), and a body reader the relay
 * feeds (null when it reports none in the body). A compressed body is read
 * decompressed, which the egress filter does; with the filter off it is not
 * read.
 */
export function readCost(
  how: UpstreamSpec['cost'],
  bodiless: boolean,
  headers: IncomingHttpHeaders,
  unfiltered: boolean,
): { header: Cost | null; body: TopLevelField | null } {
  if (how === null || bodiless) return { header: null, body: null };
  let header: Cost | null = null;
  if (how.headers !== undefined) {
    const { value, bad } = headerCost(headers, how.headers);
    const checked = plausible(value ?? 0, how.max);
    header = { value: checked.value, bad: bad || checked.bad, seen: value !== null && !checked.bad };
  }
  const body = how.jsonField === undefined || (unfiltered && headers['content-encoding'] !== undefined) ? null : new TopLevelField(how.jsonField);
  return { header, body };
}

/** The body ended: what its top-level field said, as counted. */
export function bodyCost(field: TopLevelField, max: number): Cost {
  field.end();
  const checked = plausible(field.value ?? 0, max);
  return { value: checked.value, bad: field.bad || checked.bad, seen: field.value !== null && !field.bad && !checked.bad };
}

/** A run object is a few KiB; a body larger than this is no run object. */
const RUN_OBJECT_MAX = 256 * 1024;

/**
 * Reads which run a run-start response started, as it streams past: its
 * (decoded) bytes are kept by reference, never copied, held or delayed, up
 * to a bound, and looked at when the body ended. The platform writes the run
 * object with `id` first (`{"data":{"id":"…",…}}`): read straight from the
 * bytes, a fraction of a microsecond; any other shape is parsed whole. Only
 * the id is read here (the request path pays for nothing more): the run's
 * status and cost are the settler's to ask for, off the request path.
 */
export class RunReader {
  readonly #chunks: Buffer[] = [];
  #size = 0;
  /** The run the body named, once it ended (null: no run object). */
  run: { readonly id: string } | null = null;

  push(chunk: Buffer): void {
    if (this.#size > RUN_OBJECT_MAX) return;
    this.#size += chunk.length;
    if (this.#size <= RUN_OBJECT_MAX) this.#chunks.push(chunk);
  }

  end(): void {
    if (this.#size > RUN_OBJECT_MAX || this.#size === 0) return;
    const body = this.#chunks.length === 1 ? (this.#chunks[0] as Buffer) : Buffer.concat(this.#chunks);
    const id = leadingId(body);
    if (id !== null) {
      this.run = { id };
      return;
    }
    try {
      const run = runOf(JSON.parse(body.toString('utf8')));
      this.run = run === null ? null : { id: run.id };
    } catch {
      this.run = null;
    }
  }
}

/** `{"data":{"id":"`, a blank allowed before each of its tokens (char codes; 0 marks where blanks may come). */
const DATA_ID = [0, 0x7b, 0, 0x22, 0x64, 0x61, 0x74, 0x61, 0x22, 0, 0x3a, 0, 0x7b, 0, 0x22, 0x69, 0x64, 0x22, 0, 0x3a, 0, 0x22];
const blank = (c: number | undefined): boolean => c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;

/** The id of a body that begins `{"data":{"id":"…"` (blanks allowed between tokens), or null. */
export function leadingId(body: Buffer): string | null {
  let i = 0;
  for (const c of DATA_ID) {
    if (c === 0) {
      while (blank(body[i])) i++;
    } else if (body[i++] !== c) return null;
  }
  const start = i;
  // The platform's ids are 17 alphanumerics; up to 64 of [A-Za-z0-9_-] are taken.
  for (; i < body.length && i - start <= 64; i++) {
    const c = body[i] as number;
    if (c === QUOTE) return i === start ? null : body.toString('latin1', start, i);
    if (!((c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a) || c === 0x5f || c === 0x2d)) return null;
  }
  return null;
}

/** What watches a body on its way: a top-level cost field, or a scraper run's object. */
export type BodyWatch = TopLevelField | RunReader;
