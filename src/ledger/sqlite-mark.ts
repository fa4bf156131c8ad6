// What a ledger file has been through, remembered outside it (docs/limits.md,
// "Limits under faults"; docs/operations.md, "Backing up the ledger"). In
// WAL mode a commit lives in the `-wal` file until a checkpoint copies it
// into the main file: a `-wal` removed, emptied or overwritten after a crash
// loses those commits silently, and a ledger file removed or replaced looks
// like a fresh one. Either would hand spent quota units out again. So the
// ledger holds an id and a count of its write transactions (table `meta`),
// each write transaction counts itself, and after it commits the count is
// written to `<ledger>.mark` beside it. At start a ledger whose id is not the
// mark's, or that holds fewer writes than the mark says, is damaged, never
// fresh. Checkpoints run at a stated interval, so a copy of the main file
// alone holds everything up to that interval before it was taken.
import { randomUUID } from 'node:crypto';
import { existsSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import type { DatabaseSync } from 'node:sqlite';

export const META_SCHEMA = 'create table if not exists meta (id text not null, writes integer not null)';

/** How often committed writes are checkpointed into the main file at most, ms (and at close). */
export const CHECKPOINT_MS = 10_000;

export interface Mark {
  readonly id: string;
  readonly writes: number;
}

export const markPath = (ledger: string): string => `${ledger}.mark`;

/** The mark beside a ledger, or null when there is none (a ledger from before marks, or none yet). */
export function readMark(ledger: string): Mark | null {
  const path = markPath(ledger);
  if (!existsSync(path)) return null;
  try {
    const m = JSON.parse(readFileSync(path, 'utf8')) as Partial<Mark>;
    if (typeof m.id === 'string' && typeof m.writes === 'number' && Number.isInteger(m.writes)) return { id: m.id, writes: m.writes };
  } catch {
    // Unreadable: treated as a mark that no ledger can match.
  }
  return { id: '(unreadable mark)', writes: Number.MAX_SAFE_INTEGER };
}

/** Why the ledger at `ledger` (opened as `db`, read-only) is not the one its mark remembers, or null. */
export function markProblem(db: DatabaseSync, mark: Mark): string | null {
  let row: { id: string; writes: number } | undefined;
  try {
    row = db.prepare('select id, writes from meta').get() as { id: string; writes: number } | undefined;
  } catch {
    row = undefined;
  }
  if (row === undefined) return 'it is not the ledger its mark remembers: the file was replaced, or lost its writes';
  if (row.id !== mark.id) return `it is another ledger (${row.id}) than the one its mark remembers (${mark.id})`;
  if (row.writes < mark.writes)
    return `it holds ${row.writes} writes of the ${mark.writes} its mark remembers: its -wal file was removed, emptied or overwritten before they reached the file`;
  return null;
}

/** A ledger's id and write count in its own file, and the mark beside it. */
export class LedgerMark {
  readonly #db: DatabaseSync;
  readonly #path: string;
  readonly #id: string | null;
  #checkpointed = 0;

  /** Gives the ledger an id (and a mark) when it has none and none is remembered; a remembered one is never replaced here. */
  constructor(db: DatabaseSync, ledger: string) {
    this.#db = db;
    this.#path = ledger;
    db.exec(META_SCHEMA);
    let row = db.prepare('select id from meta').get() as { id: string } | undefined;
    if (row === undefined && readMark(ledger) === null) {
      db.prepare('insert into meta (id, writes) values (?, 0)').run(randomUUID());
      row = db.prepare('select id from meta').get() as { id: string };
      this.#write({ id: row.id, writes: 0 });
    }
    this.#id = row?.id ?? null;
    // The schema reaches the main file at once: a copy of it alone is a ledger (a full disk: it stays in the -wal file).
    try {
      this.checkpoint();
    } catch {
      // Tried again after the next write.
    }
  }

  /** Inside a write transaction: count it. The count, for `committed`. */
  count(): number {
    if (this.#id === null) return 0;
    const r = this.#db.prepare('update meta set writes = writes + 1 returning writes').get() as { writes: number } | undefined;
    return r?.writes ?? 0;
  }

  /** After the commit: the count remembered beside the file, and a checkpoint when one is due. */
  committed(writes: number): void {
    if (this.#id === null) return;
    // The commit stands whatever follows: a mark that cannot be written (a
    // full disk) only lags, so a later check finds less missing, never more.
    try {
      this.#write({ id: this.#id, writes });
      if (Date.now() - this.#checkpointed >= CHECKPOINT_MS) this.checkpoint();
    } catch {
      // Tried again after the next write.
    }
  }

  /** Copy what is committed into the main file (readers are not waited for). */
  checkpoint(): void {
    this.#checkpointed = Date.now();
    this.#db.exec('pragma wal_checkpoint(PASSIVE)');
  }

  #write(mark: Mark): void {
    // Another writer of the same file (a worker) may write a count just below ours: the mark never moves back more than that.
    const current = readMark(this.#path);
    if (current !== null && current.id === mark.id && current.writes > mark.writes) return;
    const tmp = `${markPath(this.#path)}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify(mark), { mode: 0o600 });
    renameSync(tmp, markPath(this.#path));
  }
}
