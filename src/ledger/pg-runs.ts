// Pending scraper runs in PostgreSQL (runs.ts), shared by a fleet: a run is
// claimed by one gateway at a time (`for update skip locked`, then a claim
// that lasts a minute), and settled in one transaction that deletes it,
// moves its day's cost and the key's budget allowances: whichever gateway
// gets there first books it, and nobody books it twice.
import type { Database } from '../keys/store.ts';
import { budgetKind } from '../limits/leases.ts';
import { periodsOf, type DueRun, type PendingRun, type RunStore } from './runs.ts';

export class PgRunStore implements RunStore {
  readonly #pool: Database;

  constructor(pool: Database) {
    this.#pool = pool;
  }

  async dueRuns(gateway: string, now: number, limit: number, forMs: number): Promise<DueRun[]> {
    await this.#pool.migrate();
    // The database's clock decides what is due and when a claim ends (one clock for the fleet); `now` is unused here.
    void now;
    return this.#pool.bounded(
      (sql) =>
        sql<DueRun[]>`
        update keyward_runs set claimed_by = ${gateway}, claimed_until = now() + make_interval(secs => ${forMs / 1000})
        where id in (select id from keyward_runs where next_at <= now() and claimed_until < now() order by next_at limit ${limit} for update skip locked)
        returning id, key_id as "keyId", route, day::text as day, booked, path, (extract(epoch from at) * 1000)::float8 as at, attempts, credential`,
    );
  }

  async settleRun(run: PendingRun, cost: number): Promise<boolean> {
    await this.#pool.migrate();
    const delta = cost - run.booked;
    const [day, month] = periodsOf(run.day);
    return this.#pool.bounded((sql) =>
      sql.begin(async (tx) => {
        const gone = await tx`delete from keyward_runs where id = ${run.id} returning id`;
        if (gone.length === 0) return false;
        await tx`
          insert into keyward_usage (key_id, route, day, cost) values (${run.keyId}, ${run.route}, ${run.day}::date, greatest(0, ${delta}::float8))
          on conflict (key_id, route, day) do update set cost = greatest(0, keyward_usage.cost + ${delta}::float8)`;
        await tx`update keyward_credential_usage set cost = greatest(0, cost + ${delta}::float8) where route = ${run.route} and credential = ${run.credential ?? 1} and day = ${run.day}::date`;
        await tx`update keyward_allowances set granted = greatest(0, granted + ${delta}::float8) where key_id = ${run.keyId} and kind = ${budgetKind(run.route)} and period in (${day}, ${month})`;
        return true;
      }),
    );
  }

  async deferRun(id: string, attempts: number, waitMs: number): Promise<void> {
    await this.#pool.bounded(
      (sql) =>
        sql`update keyward_runs set attempts = ${attempts}, next_at = now() + make_interval(secs => ${waitMs / 1000}), claimed_by = null, claimed_until = '-infinity' where id = ${id}`,
    );
  }

  async dropRun(id: string): Promise<boolean> {
    const gone = await this.#pool.bounded((sql) => sql`delete from keyward_runs where id = ${id} returning id`);
    return gone.length > 0;
  }

  async pendingRuns(): Promise<Array<{ keyId: string; route: string; day: string; runs: number }>> {
    await this.#pool.migrate();
    return this.#pool.bounded(
      (sql) =>
        sql<
          Array<{ keyId: string; route: string; day: string; runs: number }>
        >`select key_id as "keyId", route, day::text as day, count(*)::int as runs from keyward_runs group by key_id, route, day`,
    );
  }
}
