// The usage ledger in PostgreSQL, shared by a fleet (docs/limits.md): one
// additive upsert per flush, and a heartbeat row per gateway so that each
// knows how many share the keys' rates and concurrency. Takes its connection
// from pg-store.ts.
import type postgres from 'postgres';
import { rowColumns, type FleetView, type UsageRow, type UsageStore } from '../usage/ledger.ts';

/** A gateway not seen for this long has left the fleet. */
const ALIVE_S = 10;


export class PgUsageStore implements UsageStore, FleetView {
  readonly location: string;
  readonly #sql: postgres.Sql;
  readonly #ready: () => Promise<unknown>;

  constructor(sql: postgres.Sql, location: string, migrate: () => Promise<unknown>) {
    this.#sql = sql;
    this.location = location;
    this.#ready = migrate;
  }

  get fleet(): FleetView {
    return this;
  }

  async add(rows: readonly UsageRow[]): Promise<void> {
    if (rows.length === 0) return;
    await this.#ready();
    const col = <K extends keyof UsageRow>(k: K): Array<UsageRow[K]> => rows.map((r) => r[k]);
    await this.#sql`
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
  }

  async rows(filter: { since?: string; keyId?: string; route?: string }): Promise<UsageRow[]> {
    await this.#ready();
    // Counts as float8: JavaScript numbers, not bigint strings.
    // Counts as float8: JavaScript numbers rather than bigint strings.
    return await this.#sql.unsafe<UsageRow[]>(
      `select ${rowColumns((c) => `${c}::float8`, 'day::text')} from keyward_usage
       where day >= $1::date and ($2::text is null or key_id = $2) and ($3::text is null or route = $3) order by day, key_id, route`,
      [filter.since ?? '1970-01-01', filter.keyId ?? null, filter.route ?? null],
    );
  }

  async heartbeat(id: string): Promise<number> {
    await this.#ready();
    await this.#sql`insert into keyward_gateways (id, seen) values (${id}, now()) on conflict (id) do update set seen = now()`;
    const [row] = await this.#sql<Array<{ n: number }>>`select count(*)::int as n from keyward_gateways where seen > now() - make_interval(secs => ${ALIVE_S})`;
    return Math.max(1, row?.n ?? 1);
  }

  async leave(id: string): Promise<void> {
    await this.#sql`delete from keyward_gateways where id = ${id}`;
  }

  /** The connection belongs to the key store, which closes it. */
  close(): Promise<void> {
    return Promise.resolve();
  }
}
