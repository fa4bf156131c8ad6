// Pending scraper runs in the SQLite ledger (runs.ts): recorded with the
// batch that booked their start (sqlite-store.ts), settled here in one
// transaction with the row and allowances their cost moves.
import type { DatabaseSync } from 'node:sqlite';
import { budgetKind } from '../limits/leases.ts';
import { periodsOf, type DueRun, type PendingRun, type RunStore } from './runs.ts';
import { immediate } from './sqlite-leases.ts';
import type { LedgerMark } from './sqlite-mark.ts';

export const RUN_SCHEMA = `
  create table if not exists runs (
    id text primary key, key_id text not null, route text not null, day text not null,
    booked real not null, path text not null, at integer not null,
    attempts integer not null default 0, next_at integer not null default 0,
    claimed_by text, claimed_until integer not null default 0, credential integer not null default 1
  )`;

/** A ledger written before runs kept their credential (docs/credentials.md) gains the column; its runs were all credential 1's. */
export function addRunCredential(db: DatabaseSync): void {
  const columns = db.prepare('select name from pragma_table_info(?)').all('runs') as Array<{ name: string }>;
  if (!columns.some((c) => c.name === 'credential')) db.exec('alter table runs add column credential integer not null default 1');
}

/** A run recorded with its start's batch; one recorded already (a batch sent again) is left as it is. */
export const RUN_INSERT = 'insert into runs (id, key_id, route, day, booked, path, at, credential) values (?, ?, ?, ?, ?, ?, ?, ?) on conflict (id) do nothing';

export class SqliteRunStore implements RunStore {
  readonly #db: DatabaseSync;
  readonly #mark: LedgerMark | null;

  constructor(db: DatabaseSync, mark: LedgerMark | null = null) {
    this.#db = db;
    this.#mark = mark;
  }

  dueRuns(gateway: string, now: number, limit: number, forMs: number): Promise<DueRun[]> {
    return immediate(
      this.#db,
      () =>
        this.#db
          .prepare(
            `update runs set claimed_by = ?, claimed_until = ? where id in (select id from runs where next_at <= ? and claimed_until < ? order by next_at limit ?)
             returning id, key_id as keyId, route, day, booked, path, at, attempts, credential`,
          )
          .all(gateway, now + forMs, now, now, limit) as unknown as DueRun[],
    );
  }

  settleRun(run: PendingRun, cost: number): Promise<boolean> {
    return immediate(
      this.#db,
      () => {
        if (this.#db.prepare('delete from runs where id = ? returning id').get(run.id) === undefined) return false;
        const delta = cost - run.booked;
        this.#db
          .prepare(
            'insert into usage (key_id, route, day, cost) values (?, ?, ?, max(0, ?)) on conflict (key_id, route, day) do update set cost = max(0, cost + ?)',
          )
          .run(run.keyId, run.route, run.day, delta, delta);
        // The account that ran it (routes with several credentials keep its figures; docs/credentials.md).
        this.#db
          .prepare('update credential_usage set cost = max(0, cost + ?) where route = ? and credential = ? and day = ?')
          .run(delta, run.route, run.credential ?? 1, run.day);
        const [day, month] = periodsOf(run.day);
        this.#db
          .prepare('update allowances set granted = max(0, granted + ?) where key_id = ? and kind = ? and period in (?, ?)')
          .run(delta, run.keyId, budgetKind(run.route), day, month);
        return true;
      },
      this.#mark,
    );
  }

  deferRun(id: string, attempts: number, waitMs: number): Promise<void> {
    return immediate(
      this.#db,
      () =>
        void this.#db
          .prepare('update runs set attempts = ?, next_at = ?, claimed_by = null, claimed_until = 0 where id = ?')
          .run(attempts, Date.now() + waitMs, id),
    );
  }

  dropRun(id: string): Promise<boolean> {
    return immediate(this.#db, () => this.#db.prepare('delete from runs where id = ? returning id').get(id) !== undefined);
  }

  pendingRuns(): Promise<Array<{ keyId: string; route: string; day: string; runs: number }>> {
    return Promise.resolve(
      this.#db.prepare('select key_id as keyId, route, day, count(*) as runs from runs group by key_id, route, day').all() as unknown as Array<{
        keyId: string;
        route: string;
        day: string;
        runs: number;
      }>,
    );
  }
}
