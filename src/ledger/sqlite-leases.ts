// Leases on quotas and budgets in the SQLite ledger (docs/limits.md,
// "Limits under faults"): the same rule as a fleet's (pg-leases.ts) for one
// machine. A gateway's counts reach the file only at each flush, so a
// process killed between two flushes took the requests it had admitted with
// it, and the next start admitted them again. Here the allowance moves in
// the file before a unit is admitted, in chunks (no write per request far
// from the limit): a kill -9 can waste the unused part of a chunk and never
// grant a unit again. With workers, the primary holds the leases for all.
import type { DatabaseSync } from 'node:sqlite';
import type { Allowance, Claimed, LeaseStore, LeaseUse, Want } from '../limits/leases.ts';
import { asError } from '../lib/error.ts';
import type { LedgerMark } from './sqlite-mark.ts';

export const LEASE_SCHEMA = `
  create table if not exists allowances (
    key_id text not null, kind text not null, period text not null, granted real not null default 0,
    primary key (key_id, kind, period)
  );
  create table if not exists leases (
    gateway text not null, key_id text not null, kind text not null, period text not null,
    held real not null, used real not null default 0, expires integer not null,
    primary key (gateway, key_id, kind, period)
  )`;

/** How long a claim retries while another process (a worker writing its counts) holds the file's write lock. */
const BUSY_MS = 250;

const busy = (err: unknown): boolean => /locked|busy/i.test(asError(err).message);

/** `work` in one immediate transaction; a file locked by another process is tried again for a moment (never a busy wait on the event loop). */
export async function immediate<T>(db: DatabaseSync, work: () => T, mark: LedgerMark | null = null): Promise<T> {
  const until = Date.now() + BUSY_MS;
  for (;;) {
    try {
      db.exec('begin immediate');
    } catch (err) {
      if (!busy(err) || Date.now() > until) throw err;
      await new Promise((r) => setTimeout(r, 2));
      continue;
    }
    try {
      const out = work();
      const writes = mark?.count() ?? 0;
      db.exec('commit');
      mark?.committed(writes);
      return out;
    } catch (err) {
      if (db.isTransaction) db.exec('rollback');
      throw err;
    }
  }
}

export class SqliteLeaseStore implements LeaseStore {
  readonly #db: DatabaseSync;
  readonly #now: () => number;
  readonly #mark: LedgerMark | null;

  constructor(db: DatabaseSync, now: () => number = Date.now, mark: LedgerMark | null = null) {
    this.#db = db;
    this.#now = now;
    this.#mark = mark;
  }

  #tx<T>(work: () => T): Promise<T> {
    return immediate(this.#db, work, this.#mark);
  }

  claim(gateway: string, u: Allowance, want: Want, limit: number, ttlS: number): Promise<Claimed> {
    return this.#tx(() => {
      const now = this.#now();
      this.#db.prepare('insert into allowances (key_id, kind, period) values (?, ?, ?) on conflict do nothing').run(u.keyId, u.kind, u.period);
      const a = this.#db.prepare('select granted from allowances where key_id = ? and kind = ? and period = ?').get(u.keyId, u.kind, u.period) as
        { granted: number } | undefined;
      const left = limit - (a?.granted ?? 0);
      const share = want.whole ? Math.ceil(left * want.share) : left * want.share;
      const wanted = Math.max(0, Math.min(left, Math.max(want.least, share)));
      const got = want.whole ? Math.floor(wanted) : wanted;
      if (got > 0) {
        this.#db.prepare('update allowances set granted = granted + ? where key_id = ? and kind = ? and period = ?').run(got, u.keyId, u.kind, u.period);
        this.#db
          .prepare(
            'insert into leases (gateway, key_id, kind, period, held, expires) values (?, ?, ?, ?, ?, ?) on conflict (gateway, key_id, kind, period) do update set held = held + excluded.held, expires = excluded.expires',
          )
          .run(gateway, u.keyId, u.kind, u.period, got, now + ttlS * 1000);
      }
      return { got, now };
    });
  }

  renew(gateway: string, leases: readonly LeaseUse[], ttlS: number): Promise<{ now: number; lost: number }> {
    return this.#tx(() => {
      const now = this.#now();
      let lost = 0;
      const over = this.#db.prepare('update allowances set granted = granted + ? where key_id = ? and kind = ? and period = ?');
      const exists = this.#db.prepare('select 1 as one from leases where gateway = ? and key_id = ? and kind = ? and period = ?');
      const upsert = this.#db.prepare(
        'insert into leases (gateway, key_id, kind, period, held, used, expires) values (?, ?, ?, ?, ?, ?, ?) on conflict (gateway, key_id, kind, period) do update set used = excluded.used, held = max(held, excluded.used), expires = excluded.expires',
      );
      for (const l of leases) {
        if (l.over > 0) over.run(l.over, l.keyId, l.kind, l.period);
        if (exists.get(gateway, l.keyId, l.kind, l.period) === undefined) lost++;
        upsert.run(gateway, l.keyId, l.kind, l.period, Math.max(l.held, l.used), l.used, now + ttlS * 1000);
      }
      // Expired leases end; what they held stays granted (pg-leases.ts, `sweep`).
      this.#db.prepare('delete from leases where expires < ?').run(now);
      return { now, lost };
    });
  }

  release(gateway: string, leases: readonly LeaseUse[]): Promise<void> {
    return this.#tx(() => {
      const row = this.#db.prepare('select held from leases where gateway = ? and key_id = ? and kind = ? and period = ?');
      const back = this.#db.prepare('update allowances set granted = granted - ? where key_id = ? and kind = ? and period = ?');
      const end = this.#db.prepare('delete from leases where gateway = ? and key_id = ? and kind = ? and period = ?');
      for (const l of leases) {
        const r = row.get(gateway, l.keyId, l.kind, l.period) as { held: number } | undefined;
        if (r === undefined) continue;
        if (r.held > l.used) back.run(r.held - l.used, l.keyId, l.kind, l.period);
        end.run(gateway, l.keyId, l.kind, l.period);
      }
    });
  }
}
