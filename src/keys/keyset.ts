// The in-memory key set the request path reads. Built whole from a list of
// records and swapped whole, so a lookup never sees a half-applied change.
import { isWellFormed, tokenDigestBytes } from './token.ts';

/** One key as stored (the keys file's entries). */
export interface KeyRecord {
  readonly id: string;
  readonly name: string;
  /** `sha256:<hex>` of the token. */
  readonly digest: string;
  readonly created: string;
  readonly expires: string | null;
  readonly revoked: string | null;
}

/** What the request path learns about an authenticated caller. */
export type Principal = Pick<KeyRecord, 'id' | 'name'>;

/**
 * An open-addressing hash table over raw SHA-256 digests, in typed arrays.
 * Digests are uniformly random, so their first four bytes are the hash;
 * a probe compares all 32 bytes. Compared with a Map of hex strings this
 * builds a million keys in a fraction of the time with no per-key
 * allocation, and a lookup hashes no string (bench/README.md, key scale).
 */
export class KeySet {
  readonly #records: readonly KeyRecord[];
  /** 32 bytes per active key, in insertion order. */
  readonly #digests: Buffer;
  /** Slot → 1 + position in #active; 0 is empty. Load factor ≤ 0.5. */
  readonly #slots: Int32Array;
  /** Position → index into #records. */
  readonly #active: Int32Array;
  readonly #mask: number;
  readonly size: number;

  constructor(records: readonly KeyRecord[]) {
    this.#records = records;
    let active = 0;
    for (const r of records) if (r.revoked === null) active++;
    let capacity = 8;
    while (capacity < active * 2) capacity *= 2;
    this.#mask = capacity - 1;
    this.#slots = new Int32Array(capacity);
    this.#active = new Int32Array(active);
    this.#digests = Buffer.alloc(active * 32);
    let n = 0;
    for (let i = 0; i < records.length; i++) {
      const r = records[i] as KeyRecord;
      if (r.revoked !== null) continue;
      const at = n * 32;
      // `sha256:` + 64 hex digits (checked by the file parser); hex that is
      // not hex stops the write short, leaving bytes no real digest matches.
      this.#digests.write(r.digest.slice(7), at, 32, 'hex');
      let slot = this.#digests.readUInt32LE(at) & this.#mask;
      while (this.#slots[slot] !== 0) slot = (slot + 1) & this.#mask;
      this.#slots[slot] = n + 1;
      this.#active[n] = i;
      n++;
    }
    this.size = n;
  }

  /**
   * The principal for a token, or null. Malformed tokens are refused before
   * hashing; the probe is one hash-table lookup whatever the number of keys,
   * keyed by a digest, so its timing says nothing about stored tokens.
   */
  lookup(token: string, now: number): Principal | null {
    if (!isWellFormed(token)) return null;
    const digest = tokenDigestBytes(token);
    let slot = digest.readUInt32LE(0) & this.#mask;
    for (;;) {
      const entry = this.#slots[slot] as number;
      if (entry === 0) return null;
      const at = (entry - 1) * 32;
      if (this.#digests.compare(digest, 0, 32, at, at + 32) === 0) {
        const r = this.#records[this.#active[entry - 1] as number] as KeyRecord;
        return r.expires === null || Date.parse(r.expires) > now ? r : null;
      }
      slot = (slot + 1) & this.#mask;
    }
  }
}

/** The token from an `Authorization: Bearer <token>` value (scheme case-insensitive, RFC 9110 §11.1), or null. */
export function bearerToken(header: string | undefined): string | null {
  if (header === undefined || header.length < 8) return null;
  const space = header.indexOf(' ');
  if (space !== 6 || header.slice(0, 6).toLowerCase() !== 'bearer') return null;
  let start = 7;
  while (header.charCodeAt(start) === 32) start++;
  const token = header.slice(start);
  return token.length > 0 && token.indexOf(' ') < 0 ? token : null;
}
