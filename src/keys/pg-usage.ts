// The usage ledger in PostgreSQL, shared by a fleet (docs/limits.md): one
// additive upsert per flush, and a heartbeat row per gateway so that each
// knows how many share the keys' rates and concurrency. Takes its connection
// from pg-store.ts.
import type postgres from 'postgres';
import type { FleetView, UsageRow, UsageStore } from '../usage/ledger.ts';

/** A gateway not seen for this long has left the fleet. */
const ALIVE_S = 10;

interface Stored {
  key_id: string;
  route: string;
  day: string;
  requests: number;
  s2xx: number;
  s3xx: number;
  s4xx: number;
  s5xx: number;
  other: number;
  limited: number;
  bytes_in: number;
  bytes_out: number;
  cost: number;
}

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
    const found = await this.#sql<Stored[]>`
      select key_id, route, day::text as day, requests::float8 as requests, s2xx::float8 as s2xx, s3xx::float8 as s3xx, s4xx::float8 as s4xx,
        s5xx::float8 as s5xx, other::float8 as other, limited::float8 as limited, bytes_in::float8 as bytes_in, bytes_out::float8 as bytes_out, cost
      from keyward_usage
      where day >= ${filter.since ?? '1970-01-01'}::date and (${filter.keyId ?? null}::text is null or key_id = ${filter.keyId ?? null})
        and (${filter.route ?? null}::text is null or route = ${filter.route ?? null})
      order by day, key_id, route`;
    return found.map((r) => ({
      keyId: r.key_id,
      route: r.route,
      day: r.day,
      requests: r.requests,
      s2xx: r.s2xx,
      s3xx: r.s3xx,
      s4xx: r.s4xx,
      s5xx: r.s5xx,
      other: r.other,
      limited: r.limited,
      bytesIn: r.bytes_in,
      bytesOut: r.bytes_out,
      cost: r.cost,
    }));
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
