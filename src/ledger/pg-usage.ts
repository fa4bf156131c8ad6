// The usage ledger in PostgreSQL, shared by a fleet (docs/limits.md): one
// additive upsert per flush, applied once per batch, and a heartbeat row per
// gateway so that each knows how many share the keys' rates and
// concurrency. Every query goes through the key store's pool and deadline
// (pg-store.ts): an unreachable database fails a flush, never hangs it.
import type { Database } from '../keys/store.ts';
import { PgLeaseStore } from './pg-leases.ts';
import { PgRunStore } from './pg-runs.ts';
import { rowColumns } from './columns.ts';
import type { PendingRun } from './runs.ts';
import type { AlertRow, AlertStore, BatchId, CredentialRow, DayTotal, FleetView, KeyTotal, ReportQueries, UsageRow, UsageStore } from './store.ts';

/** A gateway not seen for this long has left the fleet. */
const ALIVE_S = 10;
/** A heartbeat may be this far ahead of the database's now (the statement's own start time) and still count. */
const SKEW_S = 1;

export class PgUsageStore implements UsageStore, FleetView, AlertStore, ReportQueries {
  readonly location: string;
  /** The key store's database: its pool with deadlines, and its migrations. */
  readonly #pool: Database;

  constructor(pool: Database, location: string) {
    this.#pool = pool;
    this.location = location;
    this.leases = new PgLeaseStore(pool);
    this.runs = new PgRunStore(pool);
  }

  /** Scraper runs waiting for their cost (pg-runs.ts), settled by one gateway each. */
  readonly runs: PgRunStore;

  get fleet(): FleetView {
    return this;
  }

  get alerts(): AlertStore {
    return this;
  }

  get report(): ReportQueries {
    return this;
  }

  async daily(since: string, keyId: string | null, route: string | null): Promise<DayTotal[]> {
    await this.#pool.migrate();
    return await this.#pool.bounded(
      (sql) =>
        sql<DayTotal[]>`
        select day::text as day, route, sum(requests)::float8 as requests, sum(cost)::float8 as cost from keyward_usage
        where day >= ${since}::date and (${keyId}::text is null or key_id = ${keyId}) and (${route}::text is null or route = ${route})
        group by day, route order by day, route`,
    );
  }

  async byKey(since: string, keyIds: readonly string[] | null): Promise<KeyTotal[]> {
    await this.#pool.migrate();
    return await this.#pool.bounded((sql) =>
      keyIds === null
        ? sql<
            KeyTotal[]
          >`select key_id as "keyId", route, sum(requests)::float8 as requests, sum(cost)::float8 as cost from keyward_usage where day >= ${since}::date group by key_id, route`
        : sql<
            KeyTotal[]
          >`select key_id as "keyId", route, sum(requests)::float8 as requests, sum(cost)::float8 as cost from keyward_usage where key_id = any(${keyIds as string[]}::text[]) and day >= ${since}::date group by key_id, route`,
    );
  }

  async claimAlert(a: AlertRow): Promise<boolean> {
    await this.#pool.migrate();
    const made = await this.#pool.bounded(
      (sql) =>
        sql`insert into keyward_alerts (id, key_id, body, at) values (${a.id}, ${a.keyId}, ${a.body}, to_timestamp(${a.at / 1000})) on conflict do nothing returning id`,
    );
    return made.length > 0;
  }

  async alertDelivered(id: string): Promise<void> {
    await this.#pool.bounded((sql) => sql`update keyward_alerts set delivered = true where id = ${id}`);
  }

  async undeliveredAlerts(by: string, since: number, forMs: number): Promise<AlertRow[]> {
    await this.#pool.migrate();
    // Marked as being sent by `by`: another gateway starting now leaves them alone until `forMs` passed.
    return await this.#pool.bounded(
      (sql) =>
        sql<AlertRow[]>`
        update keyward_alerts set sender = ${by}, sending_until = now() + make_interval(secs => ${forMs / 1000})
        where not delivered and at >= to_timestamp(${since / 1000}) and sending_until < now()
        returning id, key_id as "keyId", body, (extract(epoch from at) * 1000)::float8 as at`,
    );
  }

  readonly leases: PgLeaseStore;

  async add(rows: readonly UsageRow[], batch: BatchId): Promise<void> {
    if (rows.length === 0 && (batch.credentials ?? []).length === 0) return;
    await this.#pool.migrate();
    const col = <K extends keyof UsageRow>(k: K): Array<UsageRow[K]> => rows.map((r) => r[k]);
    await this.#pool.bounded((sql) =>
      sql.begin(async (tx) => {
        // Applied once: a batch at or below the number recorded for its gateway is already counted.
        const fresh = await tx`
          insert into keyward_usage_batches (gateway, seq) values (${batch.gateway}, ${batch.seq})
          on conflict (gateway) do update set seq = excluded.seq, at = now() where keyward_usage_batches.seq < excluded.seq
          returning seq`;
        if (fresh.length === 0) return;
        await tx`
          insert into keyward_usage (key_id, route, day, requests, s2xx, s3xx, s4xx, s5xx, other, limited, bytes_in, bytes_out, cost)
          select * from unnest(${col('keyId')}::text[], ${col('route')}::text[], ${col('day')}::date[], ${col('requests')}::bigint[],
            ${col('s2xx')}::bigint[], ${col('s3xx')}::bigint[], ${col('s4xx')}::bigint[], ${col('s5xx')}::bigint[], ${col('other')}::bigint[],
            ${col('limited')}::bigint[], ${col('bytesIn')}::bigint[], ${col('bytesOut')}::bigint[], ${col('cost')}::float8[])
          on conflict (key_id, route, day) do update set
            requests = keyward_usage.requests + excluded.requests, s2xx = keyward_usage.s2xx + excluded.s2xx,
            s3xx = keyward_usage.s3xx + excluded.s3xx, s4xx = keyward_usage.s4xx + excluded.s4xx,
            s5xx = keyward_usage.s5xx + excluded.s5xx, other = keyward_usage.other + excluded.other,
            limited = keyward_usage.limited + excluded.limited, bytes_in = keyward_usage.bytes_in + excluded.bytes_in,
            bytes_out = keyward_usage.bytes_out + excluded.bytes_out, cost = keyward_usage.cost + excluded.cost`;
        const creds = batch.credentials ?? [];
        if (creds.length > 0) {
          const cc = <K extends keyof CredentialRow>(k: K): Array<CredentialRow[K]> => creds.map((r) => r[k]);
          await tx`
            insert into keyward_credential_usage (route, credential, day, requests, s2xx, s3xx, s4xx, s5xx, other, cost)
            select * from unnest(${cc('route')}::text[], ${cc('credential')}::int[], ${cc('day')}::date[], ${cc('requests')}::bigint[],
              ${cc('s2xx')}::bigint[], ${cc('s3xx')}::bigint[], ${cc('s4xx')}::bigint[], ${cc('s5xx')}::bigint[], ${cc('other')}::bigint[], ${cc('cost')}::float8[])
            on conflict (route, credential, day) do update set
              requests = keyward_credential_usage.requests + excluded.requests, s2xx = keyward_credential_usage.s2xx + excluded.s2xx,
              s3xx = keyward_credential_usage.s3xx + excluded.s3xx, s4xx = keyward_credential_usage.s4xx + excluded.s4xx,
              s5xx = keyward_credential_usage.s5xx + excluded.s5xx, other = keyward_credential_usage.other + excluded.other,
              cost = keyward_credential_usage.cost + excluded.cost`;
        }
        // Pending runs in the same transaction as the rows that booked their start: both or neither.
        const runs = batch.runs ?? [];
        if (runs.length > 0) {
          const rc = <K extends keyof PendingRun>(k: K): Array<PendingRun[K]> => runs.map((r) => r[k]);
          await tx`
            insert into keyward_runs (id, key_id, route, day, booked, path, at, credential)
            select u.id, u.key_id, u.route, u.day, u.booked, u.path, to_timestamp(u.at / 1000.0), u.credential
            from unnest(${rc('id')}::text[], ${rc('keyId')}::text[], ${rc('route')}::text[], ${rc('day')}::date[], ${rc('booked')}::float8[], ${rc('path')}::text[], ${rc('at')}::float8[],
              ${runs.map((r) => r.credential ?? 1)}::int[])
              as u(id, key_id, route, day, booked, path, at, credential)
            on conflict (id) do nothing`;
        }
      }),
    );
  }

  async credentialRows(filter: { since?: string; route?: string }): Promise<CredentialRow[]> {
    await this.#pool.migrate();
    return this.#pool.bounded(
      (sql) => sql<CredentialRow[]>`
        select route, credential, day::text as day, requests::int as requests, s2xx::int as s2xx, s3xx::int as s3xx, s4xx::int as s4xx,
          s5xx::int as s5xx, other::int as other, cost
        from keyward_credential_usage
        where day >= ${filter.since ?? '1970-01-01'}::date and (${filter.route ?? null}::text is null or route = ${filter.route ?? null})
        order by day, route, credential`,
    );
  }

  async rows(filter: { since?: string; keyId?: string; route?: string }): Promise<UsageRow[]> {
    await this.#pool.migrate();
    // Counts as float8: JavaScript numbers rather than bigint strings.
    return await this.#pool.bounded((sql) =>
      sql.unsafe<UsageRow[]>(
        `select ${rowColumns((c) => `${c}::float8`, 'day::text')} from keyward_usage
         where day >= $1::date and ($2::text is null or key_id = $2) and ($3::text is null or route = $3) order by day, key_id, route`,
        [filter.since ?? '1970-01-01', filter.keyId ?? null, filter.route ?? null],
      ),
    );
  }

  async heartbeat(id: string): Promise<number> {
    await this.#pool.migrate();
    return this.#pool.bounded(async (sql) => {
      await sql`insert into keyward_gateways (id, seen) values (${id}, now()) on conflict (id) do update set seen = now()`;
      // Rows dated ahead of the database's clock are not counted: written by hand (a gateway stamps now()), they would never expire.
      const [row] = await sql<
        Array<{ n: number }>
      >`select count(*)::int as n from keyward_gateways where seen > now() - make_interval(secs => ${ALIVE_S}) and seen <= now() + make_interval(secs => ${SKEW_S})`;
      return Math.max(1, row?.n ?? 1);
    });
  }

  async leave(id: string): Promise<void> {
    await this.#pool.bounded((sql) => sql`delete from keyward_gateways where id = ${id}`);
  }

  /** The connection belongs to the key store, which closes it. */
  close(): Promise<void> {
    return Promise.resolve();
  }
}
