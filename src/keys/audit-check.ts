// What `keyward audit verify` and `GET /v1/audit`'s `whole` check beyond the
// chain (docs/security.md, "What the audit log proves"). A hash chain shows
// an entry edited, removed or moved, but not its end cut off: the last
// entries (or all of them) can go and what is left still chains. So the
// log is held to anchors outside itself:
// - its head (seq and hash) as the keys store recorded it at its last change
//   (the keys file's `auditHead`), and as the gateway logged it at each
//   change it loaded (`audit log head`, in the journal): `--head SEQ:HASH`;
// - the store itself: every key and admin token has the entry that made it,
//   and what its entries say last is what the store holds.
// Pure.
import { canonical, SHOWN, verify, type AuditEntry, type AuditHead } from './audit.ts';
import type { KeyRecord } from './keyset.ts';
import type { AdminRecord } from './admin-record.ts';
import type { KeyStore } from './store.ts';

/** Where the log breaks, and why; seq null when no one entry is at fault (its end is missing, the store disagrees). */
export interface AuditBreak {
  readonly seq: number | null;
  readonly why: string;
}

/** `SEQ:HASH` as `audit verify --head` takes it (from the gateway's `audit log head` line); null when it is not one. */
export function parseHead(text: string): AuditHead | null {
  const m = /^(\d{1,15}):([0-9a-f]{64})$/.exec(text.trim());
  return m === null ? null : { seq: Number(m[1]), hash: m[2] as string };
}

/** The head of `entries`; null for an empty log. */
export function headOf(entries: readonly AuditEntry[]): AuditHead | null {
  const last = entries.at(-1);
  return last === undefined ? null : { seq: last.seq, hash: last.hash };
}

/**
 * Everything wrong with `entries` as the log of a store holding `keys` and
 * `admins`, anchored at `heads` (each with where it was read): the first
 * problem, or null when the log is whole.
 */
export function auditBreak(
  entries: readonly AuditEntry[],
  keys: readonly KeyRecord[],
  admins: readonly AdminRecord[],
  heads: ReadonlyArray<{ readonly head: AuditHead; readonly from: string }>,
): AuditBreak | null {
  const chained = verify(entries);
  if (chained !== null) return chained;
  const bySeq = new Map(entries.map((e) => [e.seq, e]));
  const last = entries.at(-1)?.seq ?? 0;
  for (const { head, from } of heads) {
    const at = bySeq.get(head.seq);
    if (at === undefined)
      return {
        seq: null,
        why: `${from} records entry ${head.seq} as the log's head, but the log ends at ${last === 0 ? 'no entry' : `entry ${last}`}: entries were cut from its end`,
      };
    if (at.hash !== head.hash)
      return { seq: head.seq, why: `entry ${head.seq} is not the one ${from} recorded (another hash): the log was cut and written again` };
  }
  return storeBreak(entries, keys, admins);
}

/** The store against the log: each key and admin token made by an entry, and as its last entries say. */
function storeBreak(entries: readonly AuditEntry[], keys: readonly KeyRecord[], admins: readonly AdminRecord[]): AuditBreak | null {
  const state = new Map<string, Record<string, unknown>>();
  const made = new Set<string>();
  for (const e of entries) {
    const id = e.target.id;
    if (e.action === 'key.create' || e.action === 'key.import' || e.action === 'admin.create') made.add(id);
    const s = state.get(id) ?? {};
    for (const [field, change] of Object.entries(e.changes ?? {})) s[field] = change[1];
    state.set(id, s);
  }
  // Keys made before this store kept an audit log have no entry: only those created before its first entry.
  const began = entries[0]?.at ?? null;
  for (const k of keys) {
    if (!made.has(k.id)) {
      if (began !== null && k.created < began) continue;
      return {
        seq: null,
        why:
          began === null
            ? `the log is empty, but the store holds key ${k.id}: its entries were removed`
            : `key ${k.id} has no create or import entry: its entries were removed, or it was added by hand`,
      };
    }
    const s = state.get(k.id) ?? {};
    for (const f of SHOWN) {
      if (canonical(s[f] ?? null) !== canonical(k[f] ?? null))
        return { seq: null, why: `key ${k.id}'s ${f} is not what its last entry says: the entry of that change was removed, or the store was changed by hand` };
    }
  }
  for (const a of admins) {
    if (!made.has(a.id)) return { seq: null, why: `admin token ${a.id} has no create entry: its entries were removed, or it was added by hand` };
    if (canonical(state.get(a.id)?.revoked ?? null) !== canonical(a.revoked ?? null))
      return { seq: null, why: `admin token ${a.id}'s revocation is not what its last entry says` };
  }
  return null;
}

/** `entries` held to `store`: its own anchors, its keys and admin tokens, and the heads `given` (`--head`). */
export async function auditOf(
  store: KeyStore,
  entries: readonly AuditEntry[],
  given: ReadonlyArray<{ readonly head: AuditHead; readonly from: string }> = [],
): Promise<AuditBreak | null> {
  const anchors = (await store.auditAnchors?.()) ?? [];
  return auditBreak(entries, await store.load(), await store.admins(), [...anchors, ...given]);
}
