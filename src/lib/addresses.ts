// Client addresses for per-key allowlists (docs/keys.md, "Allowed
// addresses"): address ranges (CIDR) read once into node's BlockList, and
// the client's address: the socket's, or, when the socket's is a trusted
// proxy (KEYWARD_TRUSTED_PROXIES), the nearest address in X-Forwarded-For
// that is not one (RFC 7239 §5.2's reasoning, for the de facto header: only
// what trusted hops appended can be believed, so it is read from the right).
// Pure.
import { BlockList, isIP } from 'node:net';

/** `10.0.0.0/8`, `2001:db8::/32`, or one address (a /32 or /128): its parts, or null when it is not one. */
export function parseRange(text: string): { readonly address: string; readonly prefix: number; readonly family: 'ipv4' | 'ipv6' } | null {
  const slash = text.indexOf('/');
  const address = slash < 0 ? text : text.slice(0, slash);
  const v = isIP(address);
  // A zone id (`fe80::1%lo`) is not part of any address a socket reports: the range would never match.
  if (v === 0 || address.includes('%')) return null;
  const max = v === 4 ? 32 : 128;
  const prefixText = slash < 0 ? String(max) : text.slice(slash + 1);
  if (!/^\d{1,3}$/.test(prefixText)) return null;
  const prefix = Number(prefixText);
  if (prefix > max) return null;
  if (v === 6 && prefix <= 96 && coversMapped(address, prefix)) return null;
  return { address, prefix, family: v === 4 ? 'ipv4' : 'ipv6' };
}

/**
 * Whether an IPv6 range takes in `::ffff:0:0/96`, where every IPv4 client
 * is seen (RFC 4291 §2.5.5.2): `::/8` written for IPv6 clients would let
 * in every IPv4 address too. Refused: IPv4 clients are named by IPv4 ranges.
 */
function coversMapped(address: string, prefix: number): boolean {
  const range = new BlockList();
  range.addSubnet(address, prefix, 'ipv6');
  return range.check('::ffff:0.0.0.0', 'ipv6');
}

/** Ranges as a set to test addresses against; null for an empty list. Every range must parse (checked where they are stored or configured). */
export function rangeSet(ranges: readonly string[]): BlockList | null {
  if (ranges.length === 0) return null;
  const list = new BlockList();
  for (const r of ranges) {
    const p = parseRange(r);
    if (p !== null) list.addSubnet(p.address, p.prefix, p.family);
  }
  return list;
}

/** An IPv4 address a dual-stack socket reports as `::ffff:1.2.3.4`, as the IPv4 address it is. */
export function plainAddress(address: string): string {
  return address.startsWith('::ffff:') && isIP(address.slice(7)) === 4 ? address.slice(7) : address;
}

/** Whether `address` (any form a socket or a header gives) falls in `set`; anything that is not an address does not. */
export function inRanges(set: BlockList, address: string): boolean {
  const a = plainAddress(address.trim());
  const v = isIP(a);
  return v !== 0 && set.check(a, v === 4 ? 'ipv4' : 'ipv6');
}

/**
 * The client's address: the socket's, unless it is a trusted proxy; then
 * X-Forwarded-For read from the right, past every trusted hop, to the first
 * address that is not one (all trusted: the leftmost). A value that is not an
 * address ends the walk and is the answer (it matches no allowlist).
 */
export function clientAddress(socketAddress: string, forwardedFor: string | string[] | undefined, trusted: BlockList | null): string {
  const own = plainAddress(socketAddress);
  if (trusted === null || forwardedFor === undefined || !inRanges(trusted, own)) return own;
  const hops = (Array.isArray(forwardedFor) ? forwardedFor.join(',') : forwardedFor)
    .split(',')
    .map((h) => h.trim())
    .filter((h) => h !== '');
  for (let i = hops.length - 1; i >= 0; i--) {
    const hop = plainAddress(hops[i] as string);
    if (isIP(hop) === 0 || !inRanges(trusted, hop)) return hop;
  }
  return hops.length === 0 ? own : plainAddress(hops[0] as string);
}

/** Each key's allowlist as a set, built once per record (a key set is rebuilt on every change, so a changed list is a new record). */
const SETS = new WeakMap<object, BlockList | null>();

/** The key's allowed addresses, or null when it may be used from anywhere (one property read for such a key). */
export function allowedFrom(record: { readonly limits?: { readonly allowFrom?: readonly string[] } | undefined }): BlockList | null {
  const from = record.limits?.allowFrom;
  if (from === undefined) return null;
  let set = SETS.get(record);
  if (set === undefined) {
    // An empty list allows nothing: never read as "anywhere".
    set = from.length === 0 ? new BlockList() : rangeSet(from);
    SETS.set(record, set);
  }
  return set;
}
