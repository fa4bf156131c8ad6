// The audit log of key changes (docs/operations.md, "Audit log"): one entry
// per change of a key, whoever made it, chained by SHA-256 so that an edited,
// removed or reordered entry shows. What an entry says is derived from the
// records before and after the change (never a token or a digest); the
// stores append it in the same write as the change (audit-sqlite.ts beside
// the keys file, pg-store.ts in PostgreSQL), so a change whose entry cannot
// be written is not made. Pure.
import { createHash } from 'node:crypto';
import { userInfo } from 'node:os';
import type { KeyRecord } from './keyset.ts';
import type { AdminRecord } from './admin-record.ts';

/** The last entry of a log: its seq and hash (keys/audit-check.ts checks a log's end against it). */
export interface AuditHead {
  readonly seq: number;
  readonly hash: string;
}

export type AuditAction = 'key.create' | 'key.update' | 'key.rotate' | 'key.revoke' | 'key.import' | 'admin.create' | 'admin.revoke';

/** Who made a change: an operator on a host (the OS user), or an admin token over HTTP (its name and the caller's address). */
export type Actor = { readonly kind: 'cli'; readonly user: string } | { readonly kind: 'admin'; readonly name: string; readonly address: string };

/** An entry before it joins the chain. */
export interface AuditDraft {
  readonly at: string;
  readonly actor: Actor;
  readonly action: AuditAction;
  readonly target: { readonly id: string; readonly name: string };
  /** Field → [before, after]; never a token or digest. */
  readonly changes: Readonly<Record<string, readonly [unknown, unknown]>>;
  readonly requestId: string | null;
}

/** An entry as stored: its place in the chain and its hash. */
export interface AuditEntry extends AuditDraft {
  readonly seq: number;
  /** SHA-256 (hex) of the previous entry's hash and this entry's canonical JSON without its hash. */
  readonly hash: string;
}

/** The hash before the first entry. */
export const GENESIS = '0'.repeat(64);

/** The OS user running the CLI; `uid N` where it has no name. */
export function cliActor(): Actor {
  try {
    return { kind: 'cli', user: userInfo().username };
  } catch {
    return { kind: 'cli', user: `uid ${process.getuid?.() ?? '?'}` };
  }
}

/** JSON with object keys sorted at every depth: one spelling per value, so a hash can be recomputed. */
export function canonical(value: unknown): string {
  if (value === null || typeof value !== 'object') return JSON.stringify(value) ?? 'null';
  if (Array.isArray(value)) return `[${value.map(canonical).join(',')}]`;
  const o = value as Record<string, unknown>;
  const keys = Object.keys(o)
    .filter((k) => o[k] !== undefined)
    .sort();
  return `{${keys.map((k) => `${JSON.stringify(k)}:${canonical(o[k])}`).join(',')}}`;
}

/** The hash of `entry` (everything but its hash) after `previous`. */
export function entryHash(previous: string, entry: Omit<AuditEntry, 'hash'>): string {
  return createHash('sha256')
    .update(previous)
    .update(canonical({ ...entry, hash: undefined }))
    .digest('hex');
}

/** `drafts` joined to a chain whose last entry is `last` (null: an empty log). */
export function chain(last: { readonly seq: number; readonly hash: string } | null, drafts: readonly AuditDraft[]): AuditEntry[] {
  let seq = last?.seq ?? 0;
  let previous = last?.hash ?? GENESIS;
  return drafts.map((d) => {
    const body = { ...d, seq: ++seq };
    const hash = entryHash(previous, body);
    previous = hash;
    return { ...body, hash };
  });
}

/** The first entry that breaks the chain (edited, removed, reordered), with why; null when it is whole. */
export function verify(entries: readonly AuditEntry[]): { readonly seq: number; readonly why: string } | null {
  let previous = GENESIS;
  let expected = 1;
  for (const e of entries) {
    if (e.seq !== expected) return { seq: e.seq, why: e.seq > expected ? `entry ${expected} is missing` : `entry ${e.seq} is out of order` };
    const { hash, ...body } = e;
    if (entryHash(previous, body) !== hash) return { seq: e.seq, why: `entry ${e.seq} does not match its hash (edited, or an entry before it was)` };
    previous = hash;
    expected++;
  }
  return null;
}

/** The fields an entry shows of a key: never its digest, nor the digests of rotated-out tokens. */
export const SHOWN = ['name', 'expires', 'revoked', 'routes', 'limits', 'externalId'] as const;

/**
 * One draft per key the change created or changed (docs/operations.md,
 * "Audit log"): created (or imported), revoked, rotated (its digest
 * changed), or otherwise updated; with each shown field that changed.
 */
export function drafts(
  before: readonly KeyRecord[],
  after: readonly KeyRecord[],
  context: { readonly actor: Actor; readonly requestId?: string | null; readonly importing?: boolean },
  now: number,
): AuditDraft[] {
  const was = new Map(before.map((r) => [r.id, r]));
  const at = new Date(now).toISOString();
  const out: AuditDraft[] = [];
  for (const r of after) {
    const old = was.get(r.id);
    if (old !== undefined && canonical(old) === canonical(r)) continue;
    const changes: Record<string, readonly [unknown, unknown]> = {};
    for (const f of SHOWN) {
      const a = old?.[f] ?? null;
      const b = r[f] ?? null;
      if (canonical(a) !== canonical(b)) changes[f] = [a, b];
    }
    const action: AuditAction =
      old === undefined
        ? context.importing === true
          ? 'key.import'
          : 'key.create'
        : old.revoked === null && r.revoked !== null
          ? 'key.revoke'
          : old.digest !== r.digest
            ? 'key.rotate'
            : 'key.update';
    // An update that changes no field shown (`routes: null` for none, a spelling) is no change to audit.
    if (action === 'key.update' && Object.keys(changes).length === 0) continue;
    out.push({ at, actor: context.actor, action, target: { id: r.id, name: r.name }, changes, requestId: context.requestId ?? null });
  }
  return out;
}

/** One draft per admin token created or revoked (`admin.create`, `admin.revoke`), with its name, role and revocation: never its digest. */
export function adminDrafts(
  before: readonly AdminRecord[],
  after: readonly AdminRecord[],
  context: { readonly actor: Actor; readonly requestId?: string | null },
  now: number,
): AuditDraft[] {
  const was = new Map(before.map((a) => [a.id, a]));
  const at = new Date(now).toISOString();
  const out: AuditDraft[] = [];
  for (const a of after) {
    const old = was.get(a.id);
    if (old !== undefined && old.revoked === a.revoked) continue;
    const changes: Record<string, readonly [unknown, unknown]> =
      old === undefined ? { name: [null, a.name], role: [null, a.role] } : { revoked: [old.revoked, a.revoked] };
    out.push({
      at,
      actor: context.actor,
      action: old === undefined ? 'admin.create' : 'admin.revoke',
      target: { id: a.id, name: a.name },
      changes,
      requestId: context.requestId ?? null,
    });
  }
  return out;
}
