// The in-memory key set the request path reads. Built whole from a list of
// records and swapped whole, so a lookup never sees a half-applied change.
import type { Limits } from './limits.ts';
import { tokenDigestBytes } from './token.ts';

/** A digest that still opens the key until `until` (the grace period of `keys rotate`). */
export interface PreviousDigest {
  readonly digest: string;
  readonly until: string;
}

/** One key as stored (the keys file's entries). */
export interface KeyRecord {
  readonly id: string;
  readonly name: string;
  /** `sha256:<hex>` of the token. */
  readonly digest: string;
  readonly created: string;
  readonly expires: string | null;
  readonly revoked: string | null;
  /** Routes the key may use; absent or null: every route. */
  readonly routes?: readonly string[] | null;
  /** Digests of earlier tokens still accepted until their time (rotation). */
  readonly previous?: readonly PreviousDigest[];
  /** Rate, concurrency, quota and budgets (docs/limits.md); absent: none. */
  readonly limits?: Limits;
  /** The caller's own id for the key (keys as code, docs/admin-api.md): unique in the store; `ext:<id>` names the key. */
  readonly externalId?: string;
  /** The record format a keyward needs to serve this key (record.ts, RECORD_FORMAT); absent: 1. */
  readonly requires?: number;
}

/** On a record this version reads but cannot enforce (record.ts, readRecord): why. A symbol, so it is never written back to the store. */
export const UNSUPPORTED = Symbol('keyward.unsupported');

/** Why this version cannot serve `r`, or null. */
export const unsupportedOf = (r: KeyRecord): string | null => (r as { [UNSUPPORTED]?: string })[UNSUPPORTED] ?? null;

/** A key refused only because its rules need a newer keyward: revoked and expired keys are refused whatever they hold. */
export const awaitsNewer = (r: KeyRecord, now: number): boolean =>
  unsupportedOf(r) !== null && r.revoked === null && (r.expires === null || Date.parse(r.expires) > now);

/** What the request path learns about a caller: the record itself (ids, name, scope). */
export type Principal = KeyRecord;

/** Why a known key is refused: revoked or expired (401), or written with rules this version cannot enforce (503, record.ts). */
export type Refusal = 'revoked' | 'expired' | 'unsupported';

/** A token that names a known key, and whether the key may be used now. */
export interface Lookup {
  readonly principal: Principal;
  /** Null when the key is usable. */
  readonly refusal: Refusal | null;
}

/** May this key use this route? */
export function inScope(principal: Principal, route: string): boolean {
  const routes = principal.routes;
  return routes === undefined || routes === null || routes.includes(route);
}

function countDigests(records: readonly KeyRecord[]): number {
  let n = 0;
  for (const r of records) n += 1 + (r.previous?.length ?? 0);
  return n;
}

/**
 * The 32 bytes at `at` of `digests` are `digest`'s. Eight 32-bit reads: the
 * native Buffer.compare with offsets cost more to call than the comparison
 * itself, on every request. An early exit tells a caller at most how many
 * leading bytes of its token's SHA-256 match a stored digest, which helps
 * no one find a token (the table's slot already depends on the first four).
 */
function sameDigest(digests: Buffer, at: number, digest: Buffer): boolean {
  for (let i = 0; i < 32; i += 4) if (digests.readInt32LE(at + i) !== digest.readInt32LE(i)) return false;
  return true;
}

/** The digest index: immutable once built, so key sets whose digests are the same share it. */
interface Table {
  /** 32 bytes per digest, in insertion order. */
  readonly digests: Buffer;
  /** Slot → 1 + entry number; 0 is empty. Load factor ≤ 0.5. */
  readonly slots: Int32Array;
  /** Entry → index into the records. */
  readonly entryRecord: Int32Array;
  /** Entry → time (ms) the digest stops opening the key: Infinity for the current token. */
  readonly entryUntil: Float64Array;
  readonly mask: number;
}

function buildTable(records: readonly KeyRecord[]): Table {
  const entries = countDigests(records);
  let capacity = 8;
  while (capacity < entries * 2) capacity *= 2;
  const t: Table = {
    digests: Buffer.alloc(entries * 32),
    slots: new Int32Array(capacity),
    entryRecord: new Int32Array(entries),
    entryUntil: new Float64Array(entries),
    mask: capacity - 1,
  };
  let n = 0;
  const add = (digest: unknown, record: number, until: number): void => {
    // A row written behind keyward's back may lack a digest: it opens nothing,
    // and must not take the rest of the set down with it.
    if (typeof digest !== 'string') return;
    const at = n * 32;
    // `sha256:` + 64 hex digits (checked by the file parser); hex that is
    // not hex stops the write short, leaving bytes no real digest matches.
    t.digests.write(digest.slice(7), at, 32, 'hex');
    let slot = t.digests.readUInt32LE(at) & t.mask;
    while (t.slots[slot] !== 0) slot = (slot + 1) & t.mask;
    t.slots[slot] = n + 1;
    t.entryRecord[n] = record;
    t.entryUntil[n] = until;
    n++;
  };
  for (let i = 0; i < records.length; i++) {
    const r = records[i] as KeyRecord;
    add(r.digest, i, Infinity);
    const previous: unknown = r.previous;
    if (Array.isArray(previous)) for (const p of previous as unknown[]) add(field(p, 'digest'), i, graceEnd(field(p, 'until')));
  }
  return t;
}

/** A field of what may not be an object (a row written behind keyward's back). */
const field = (o: unknown, name: string): unknown => (typeof o === 'object' && o !== null && name in o ? (o as Record<string, unknown>)[name] : undefined);

/**
 * When a rotated-out token stops, ms. A grace date that is not a date (a
 * number, "never", null, "") ends the grace at once: failing open would keep
 * an old token valid for ever.
 */
function graceEnd(until: unknown): number {
  const ms = typeof until === 'string' ? Date.parse(until) : Number.NaN;
  return Number.isNaN(ms) ? -Infinity : ms;
}

/**
 * `records` with each unsupported one (record.ts) reduced to what this
 * version reads of it: its identity, state and rotated-out tokens. Its
 * rules (limits, scope) are never read by anything here, since the key is
 * refused; the store keeps them as they were. The same array when none is.
 */
function servable(records: readonly KeyRecord[]): readonly KeyRecord[] {
  let out: KeyRecord[] | null = null;
  for (let i = 0; i < records.length; i++) {
    const r = records[i] as KeyRecord;
    const why = unsupportedOf(r);
    if (why === null) continue;
    out ??= records.slice();
    const previous = Array.isArray(r.previous) ? { previous: r.previous } : {};
    out[i] = {
      id: r.id,
      name: r.name,
      digest: r.digest,
      created: r.created,
      expires: r.expires,
      revoked: r.revoked,
      ...previous,
      [UNSUPPORTED]: why,
    } as unknown as KeyRecord;
  }
  return out ?? records;
}

/** Same digests (current and previous, with their times) at the same position. */
function sameDigests(a: KeyRecord, b: KeyRecord): boolean {
  if (a === b) return true;
  if (a.digest !== b.digest) return false;
  const pa = a.previous ?? [];
  const pb = b.previous ?? [];
  return pa.length === pb.length && pa.every((p, i) => p.digest === pb[i]?.digest && p.until === pb[i]?.until);
}

/**
 * An open-addressing hash table over raw SHA-256 digests, in typed arrays.
 * Digests are uniformly random, so their first four bytes are the hash;
 * a probe compares all 32 bytes. Compared with a Map of hex strings this
 * builds a million keys in a fraction of the time with no per-key
 * allocation, and a lookup hashes no string (bench/README.md, key scale).
 *
 * Revoked keys stay in the table so that a refusal can still say which key
 * was refused (docs/logs.md); every record's expiry is parsed once, here.
 */
export class KeySet {
  readonly #records: readonly KeyRecord[];
  readonly #table: Table;
  /** Record → expiry (ms), Infinity for none. */
  readonly #expires: Float64Array;
  /** Keys neither revoked nor (at build time) expired. */
  readonly size: number;
  /** Keys this version cannot serve (record.ts, readRecord): refused with 503 key_unsupported. */
  readonly unsupported: number;

  /** Every record of the set, revoked and expired ones included (the usage page names keys by them). */
  get records(): readonly KeyRecord[] {
    return this.#records;
  }

  constructor(stored: readonly KeyRecord[], now = Date.now(), table?: Table) {
    const records = servable(stored);
    this.#records = records;
    this.#table = table ?? buildTable(records);
    this.#expires = new Float64Array(records.length);
    let active = 0;
    let unsupported = 0;
    for (let i = 0; i < records.length; i++) {
      const r = records[i] as KeyRecord;
      const expires = r.expires === null ? Infinity : Date.parse(r.expires);
      this.#expires[i] = expires;
      if (r.revoked !== null || expires <= now) continue;
      if (unsupportedOf(r) === null) active++;
      else unsupported++;
    }
    this.size = active;
    this.unsupported = unsupported;
  }

  /**
   * The set for `records`, the store's next full list. When every key is
   * where it was with the same digests (a revocation, a change of scope or
   * expiry: the changes that must take effect fast) the digest index is
   * shared and only the records are swapped, which with a million keys is
   * tens of milliseconds instead of a rebuild of several hundred.
   */
  next(records: readonly KeyRecord[], now = Date.now()): KeySet {
    const before = this.#records;
    if (records.length !== before.length) return new KeySet(records, now);
    for (let i = 0; i < records.length; i++) if (!sameDigests(before[i] as KeyRecord, records[i] as KeyRecord)) return new KeySet(records, now);
    return new KeySet(records, now, this.#table);
  }

  /** Counts by state, for the `keyward_keys{state}` gauge. */
  states(now: number): { active: number; revoked: number; expired: number } {
    let revoked = 0;
    let expired = 0;
    for (let i = 0; i < this.#records.length; i++) {
      if ((this.#records[i] as KeyRecord).revoked !== null) revoked++;
      else if ((this.#expires[i] as number) <= now) expired++;
    }
    return { active: this.#records.length - revoked - expired, revoked, expired };
  }

  /**
   * The key a token opens, or null for a token that names no key (or a
   * rotated-out one past its grace). The caller refuses malformed tokens
   * first (isWellFormed, without hashing); one that reaches here opens
   * nothing all the same, since its digest is in no table. The probe is one
   * hash-table lookup whatever the number of keys, keyed by a digest, so its
   * timing says nothing about stored tokens.
   */
  lookup(token: string, now: number): Lookup | null {
    return this.lookupDigest(tokenDigestBytes(token), now);
  }

  /** lookup for a token whose digest (tokenDigestBytes) is known already: a connection's memo (token.ts, TokenMemo). */
  lookupDigest(digest: Buffer, now: number): Lookup | null {
    const t = this.#table;
    let slot = digest.readUInt32LE(0) & t.mask;
    for (;;) {
      const entry = t.slots[slot] as number;
      if (entry === 0) return null;
      const at = (entry - 1) * 32;
      if (sameDigest(t.digests, at, digest)) {
        if ((t.entryUntil[entry - 1] as number) <= now) return null;
        const index = t.entryRecord[entry - 1] as number;
        const principal = this.#records[index] as KeyRecord;
        // A revocation and an expiry apply whatever else the record holds.
        const refusal =
          principal.revoked !== null
            ? 'revoked'
            : (this.#expires[index] as number) <= now
              ? 'expired'
              : unsupportedOf(principal) === null
                ? null
                : 'unsupported';
        return { principal, refusal };
      }
      slot = (slot + 1) & t.mask;
    }
  }
}
