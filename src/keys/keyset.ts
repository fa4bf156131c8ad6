// The in-memory key set the request path reads. Built whole from a list of
// records and swapped whole, so a lookup never sees a half-applied change.
import { isWellFormed, tokenDigest } from './token.ts';

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
export interface Principal {
  readonly id: string;
  readonly name: string;
  /** Epoch ms; Infinity when the key never expires. */
  readonly expiresAt: number;
}

export class KeySet {
  readonly #byDigest: Map<string, Principal>;
  readonly size: number;

  constructor(records: readonly KeyRecord[]) {
    this.#byDigest = new Map();
    for (const r of records) {
      if (r.revoked !== null) continue;
      const expiresAt = r.expires === null ? Infinity : Date.parse(r.expires);
      this.#byDigest.set(r.digest.slice(7), Object.freeze({ id: r.id, name: r.name, expiresAt }));
    }
    this.size = this.#byDigest.size;
  }

  /**
   * The principal for a token, or null. Malformed tokens are refused before
   * hashing; the probe is one hash-map lookup whatever the number of keys,
   * keyed by a digest, so its timing says nothing about stored tokens.
   */
  lookup(token: string, now: number): Principal | null {
    if (!isWellFormed(token)) return null;
    const p = this.#byDigest.get(tokenDigest(token));
    return p !== undefined && p.expiresAt > now ? p : null;
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
