// Client token format (docs/authentication.md): `kw_` + 32 random bytes in base62 (43
// characters) + a 6-character base62 CRC-32 of those 43 characters. The
// prefix lets secret scanners spot leaked tokens; the checksum lets the
// gateway refuse typos and garbage without touching the key set (the same
// scheme GitHub uses for its tokens). Only the SHA-256 digest is ever stored.
import { createHash, hash, randomBytes } from 'node:crypto';
import { crc32 } from 'node:zlib';

const TOKEN_PREFIX = 'kw_';
const ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const BODY_LENGTH = 43; // ceil(256 / log2(62))
const CHECK_LENGTH = 6; // ceil(32 / log2(62))
export const TOKEN_LENGTH = TOKEN_PREFIX.length + BODY_LENGTH + CHECK_LENGTH;
const SHAPE = /^kw_[0-9A-Za-z]{49}$/;

function base62(value: bigint, width: number): string {
  let out = '';
  let v = value;
  while (v > 0n) {
    out = ALPHABET[Number(v % 62n)] + out;
    v /= 62n;
  }
  return out.padStart(width, '0');
}

/** The CRC-32 of the body in base62, six digits: in plain numbers (a CRC-32 fits a double), on every request's path. */
function checksum(body: string): string {
  let v = crc32(body);
  let out = '';
  for (let i = 0; i < CHECK_LENGTH; i++) {
    out = (ALPHABET[v % 62] as string) + out;
    v = Math.floor(v / 62);
  }
  return out;
}

export function generateToken(): string {
  const body = base62(BigInt(`0x${randomBytes(32).toString('hex')}`), BODY_LENGTH);
  return TOKEN_PREFIX + body + checksum(body);
}

/**
 * Admin tokens (docs/admin-api.md) have the client tokens' shape under a
 * prefix of their own, `kwa_`, and their checksum covers the prefix too:
 * neither kind is ever well formed as the other, not even with its prefix
 * swapped, so a client key never opens the admin API and an admin token
 * never the public port, before any lookup.
 */
export const ADMIN_PREFIX = 'kwa_';
const ADMIN_SHAPE = /^kwa_[0-9A-Za-z]{49}$/;

export function generateAdminToken(): string {
  const body = base62(BigInt(`0x${randomBytes(32).toString('hex')}`), BODY_LENGTH);
  return ADMIN_PREFIX + body + checksum(ADMIN_PREFIX + body);
}

/** An admin token's shape and checksum (as isWellFormed for client tokens). */
export function isWellFormedAdmin(token: string): boolean {
  if (!ADMIN_SHAPE.test(token)) return false;
  return token.endsWith(checksum(token.slice(0, ADMIN_PREFIX.length + BODY_LENGTH)));
}

/** Shape and checksum only; says nothing about whether the key exists. */
export function isWellFormed(token: string): boolean {
  if (token.length !== TOKEN_LENGTH || !SHAPE.test(token)) return false;
  const body = token.slice(TOKEN_PREFIX.length, TOKEN_PREFIX.length + BODY_LENGTH);
  return token.endsWith(checksum(body));
}

/** What the key store keeps instead of the token. */
export function tokenDigest(token: string): string {
  return createHash('sha256').update(token).digest('hex');
}

/** The same digest as bytes, for the request path's lookup. */
export function tokenDigestBytes(token: string): Buffer {
  // The one-shot form allocates no Hash object, on every authenticated request.
  return hash('sha256', token, 'buffer');
}

/**
 * Equal strings, compared in a time that depends on their length only,
 * never on where they first differ: a connection's memo (below) must not
 * tell a caller how much of a guess matched what it holds.
 */
export function sameText(a: string, b: string): boolean {
  if (a.length !== b.length) return false;
  let diff = 0;
  for (let i = 0; i < a.length; i++) diff |= a.charCodeAt(i) ^ b.charCodeAt(i);
  return diff === 0;
}

/**
 * The last well-formed token one client connection presented, and its
 * digest (docs/authentication.md, "One connection, one digest"). A
 * keep-alive client sends the same token on every request: its shape,
 * checksum and SHA-256 are worked out once per connection instead of once
 * per request. Only what is a pure function of the token is kept, never
 * whether it opens a key: every request still looks its digest up in the
 * key set in force, so a revocation takes effect on the next request of an
 * open connection as on any other. A different token (a client behind a
 * proxy that pools connections) is checked and hashed as usual, and
 * replaces the memo.
 */
export class TokenMemo {
  #token: string | null = null;
  #digest: Buffer | null = null;

  /** The digest of `token` when it is the token remembered here; null otherwise (check its shape and hash it). */
  digestOf(token: string): Buffer | null {
    return this.#token !== null && sameText(this.#token, token) ? this.#digest : null;
  }

  /** `token` is well-formed and `digest` is its tokenDigestBytes. */
  remember(token: string, digest: Buffer): void {
    this.#token = token;
    this.#digest = digest;
  }
}

/**
 * Anything shaped like a client token, or an admin token (`kwa_`), as it may
 * travel in a URL or a header: neither is ever forwarded or logged. Any case (a lower-cased token is still a leak) and any character
 * percent-encoded (`%6Bw_…`, `kw%5F…`), since the upstream's parser decodes
 * what the gateway's literal comparison would miss. 32 characters after the
 * prefix are enough to be a token fragment worth refusing; real tokens have 49.
 */
const TOKEN_LIKE_SOURCE = '(?:k|%4b|%6b)(?:w|%57|%77)(?:a|%41|%61)?(?:_|%5f)(?:[0-9a-z]|%[0-9a-f]{2}){32,}';
const TOKEN_LIKE = new RegExp(TOKEN_LIKE_SOURCE, 'i');
const TOKEN_LIKE_ALL = new RegExp(TOKEN_LIKE_SOURCE, 'gi');

/** True when `text` carries something shaped like a client token, in any case or percent-encoding. */
export function containsTokenLike(text: string): boolean {
  // Every form needs `_` or its encoding `%5F`: most texts are cleared by two scans.
  if (text.indexOf('_') < 0 && text.indexOf('%') < 0) return false;
  return TOKEN_LIKE.test(text);
}

/** `text` with every token-shaped run replaced, for log lines. */
export function redactTokens(text: string): string {
  return containsTokenLike(text) ? text.replace(TOKEN_LIKE_ALL, 'kw_[redacted]') : text;
}
