// The audit log of a keys file (audit.ts), in SQLite beside it
// (`keys.json.audit.sqlite`, mode 0600): appended under the keys file's lock,
// before the file is written, so a change whose entry cannot be written is
// not made. Each row is an entry's canonical JSON and its hash, exactly as
// hashed, so `keyward audit verify` recomputes the chain from what is stored.
import { chmodSync, closeSync, existsSync, openSync } from 'node:fs';
import { DatabaseSync } from 'node:sqlite';
import { canonical, chain, type AuditDraft, type AuditEntry } from './audit.ts';

const SCHEMA = 'create table if not exists audit (seq integer primary key, body text not null, hash text not null)';

/** The audit log's file for a keys file. */
export const auditPath = (keysFile: string): string => `${keysFile}.audit.sqlite`;

/** Append `drafts` to the log at `path` in one transaction (the file made, mode 0600, if it is not there). */
export function appendAudit(path: string, drafts: readonly AuditDraft[]): AuditEntry[] {
  if (drafts.length === 0) return [];
  if (!existsSync(path)) closeSync(openSync(path, 'a', 0o600));
  for (const f of [path, `${path}-wal`, `${path}-shm`]) if (existsSync(f)) chmodSync(f, 0o600);
  const db = new DatabaseSync(path);
  try {
    // The CLI is the only writer, under the keys file's lock; a reader never blocks it (WAL).
    db.exec('pragma journal_mode = wal; pragma busy_timeout = 5000;');
    db.exec(SCHEMA);
    db.exec('begin immediate');
    try {
      const last = db.prepare('select seq, hash from audit order by seq desc limit 1').get() as { seq: number; hash: string } | undefined;
      const entries = chain(last ?? null, drafts);
      const insert = db.prepare('insert into audit (seq, body, hash) values (?, ?, ?)');
      for (const e of entries) insert.run(e.seq, bodyOf(e), e.hash);
      db.exec('commit');
      return entries;
    } catch (err) {
      if (db.isTransaction) db.exec('rollback');
      throw err;
    }
  } finally {
    db.close();
  }
}

/** An entry's stored body: its canonical JSON without the hash. */
export function bodyOf(e: AuditEntry): string {
  return canonical({ ...e, hash: undefined });
}

/** Every entry at `path`, in order; none when there is no log yet. */
export function readAudit(path: string): AuditEntry[] {
  if (!existsSync(path)) return [];
  const db = new DatabaseSync(path, { readOnly: true });
  try {
    const rows = db.prepare('select seq, body, hash from audit order by seq').all() as Array<{ seq: number; body: string; hash: string }>;
    return rows.map(entryOf);
  } finally {
    db.close();
  }
}

/** A stored row as an entry: the body as stored (an edit shows in the hash), its seq the row's. */
export function entryOf(row: { seq: number | string; body: string; hash: string }): AuditEntry {
  let body: Record<string, unknown>;
  try {
    body = JSON.parse(row.body) as Record<string, unknown>;
  } catch {
    body = { unreadable: row.body };
  }
  // The row's place, not the body's: an entry moved to another place no longer matches its hash.
  return { ...(body as unknown as AuditEntry), seq: Number(row.seq), hash: row.hash };
}
