// Leases on quotas and budgets in PostgreSQL (docs/limits.md, "Across a
// fleet"): a gateway claims a part of a key's period allowance with one
// atomic conditional update, admits from it locally, reports what it used
// and renews at every flush, and gives back what it did not use when it
// drains. A lease not renewed by its expiry (a gateway that died, froze or
// was cut off) is swept by any gateway, and what it held stays granted: its
// holder may have admitted from it after its last report (leases.ts). The
// database's clock decides when a lease expires, and its now() is returned
// so that gateways read periods from one clock.
import type postgres from 'postgres';
import type { Database } from '../keys/store.ts';
import type { Allowance, Claimed, LeaseStore, LeaseUse, Want } from '../limits/leases.ts';

export class PgLeaseStore implements LeaseStore {
  /** The key store's database: its pool with deadlines, and its migrations. */
  readonly #pool: Database;

  constructor(pool: Database) {
    this.#pool = pool;
  }

  async claim(gateway: string, u: Allowance, want: Want, limit: number, ttlS: number): Promise<Claimed> {
    await this.#pool.migrate();
    return this.#pool.bounded((sql) =>
      sql.begin(async (tx) => {
        await tx`insert into keyward_allowances (key_id, kind, period) values (${u.keyId}, ${u.kind}, ${u.period}) on conflict do nothing`;
        // Row-locked read and conditional update: no two gateways are ever handed the same unit.
        const [a] = await tx<
          Array<{ granted: number }>
        >`select granted from keyward_allowances where key_id = ${u.keyId} and kind = ${u.kind} and period = ${u.period} for update`;
        const left = limit - (a?.granted ?? 0);
        // A share of what is left, at least what this request needs: chunks shrink to one unit near the end.
        const share = want.whole ? Math.ceil(left * want.share) : left * want.share;
        const wanted = Math.max(0, Math.min(left, Math.max(want.least, share)));
        const got = want.whole ? Math.floor(wanted) : wanted;
        if (got > 0) {
          await tx`update keyward_allowances set granted = granted + ${got} where key_id = ${u.keyId} and kind = ${u.kind} and period = ${u.period}`;
          await tx`
            insert into keyward_leases (gateway, key_id, kind, period, held, expires) values (${gateway}, ${u.keyId}, ${u.kind}, ${u.period}, ${got}, now() + make_interval(secs => ${ttlS}))
            on conflict (gateway, key_id, kind, period) do update set held = keyward_leases.held + excluded.held, expires = excluded.expires`;
        }
        const [clock] = await tx<Array<{ now: number }>>`select extract(epoch from clock_timestamp())::float8 * 1000 as now`;
        return { got, now: clock?.now ?? Date.now() };
      }),
    );
  }

  async renew(gateway: string, leases: readonly LeaseUse[], ttlS: number): Promise<{ now: number; lost: number }> {
    await this.#pool.migrate();
    const col = <K extends keyof LeaseUse>(k: K): Array<LeaseUse[K]> => leases.map((l) => l[k]);
    return this.#pool.bounded((sql) =>
      sql.begin(async (tx) => {
        let lost = 0;
        // Swept first: a lease of this gateway past its expiry that nobody
        // swept yet (the others' sweeps may have waited on this gateway's own
        // transaction, frozen with it) is ended here too, so its holder is
        // told either way, and writes it back below.
        await sweep(tx);
        if (leases.length > 0) {
          // Spent beyond what was held (a budget's estimate fell short) is added to the allowance.
          await tx`
            with u as (select * from unnest(${col('keyId')}::text[], ${col('kind')}::text[], ${col('period')}::text[], ${col('over')}::float8[]) as u(key_id, kind, period, over))
            update keyward_allowances a set granted = a.granted + u.over from u
            where u.over > 0 and a.key_id = u.key_id and a.kind = u.kind and a.period = u.period`;
          // What was used, and the lease extended; one swept meanwhile is written back (inserted), its units still granted.
          const rows = await tx<Array<{ inserted: boolean }>>`
            insert into keyward_leases (gateway, key_id, kind, period, held, used, expires)
            select ${gateway}, u.key_id, u.kind, u.period, greatest(u.held, u.used), u.used, now() + make_interval(secs => ${ttlS})
            from unnest(${col('keyId')}::text[], ${col('kind')}::text[], ${col('period')}::text[], ${col('held')}::float8[], ${col('used')}::float8[]) as u(key_id, kind, period, held, used)
            on conflict (gateway, key_id, kind, period) do update set used = excluded.used, held = greatest(keyward_leases.held, excluded.used), expires = excluded.expires
            returning (xmax = 0) as inserted`;
          lost = rows.filter((r) => r.inserted).length;
        }
        const [clock] = await tx<Array<{ now: number }>>`select extract(epoch from clock_timestamp())::float8 * 1000 as now`;
        return { now: clock?.now ?? Date.now(), lost };
      }),
    );
  }

  async costs(mine: ReadonlyArray<readonly [string, number]>): Promise<Array<readonly [string, number]>> {
    await this.#pool.migrate();
    return this.#pool.bounded(async (sql) => {
      if (mine.length > 0) {
        await sql`
          insert into keyward_costs (route, per_call)
          select * from unnest(${mine.map((m) => m[0])}::text[], ${mine.map((m) => m[1])}::float8[])
          on conflict (route) do update set per_call = excluded.per_call, at = now()`;
      }
      const rows = await sql<Array<{ route: string; per_call: number }>>`select route, per_call from keyward_costs`;
      return rows.map((r) => [r.route, r.per_call] as const);
    });
  }

  async release(gateway: string, leases: readonly LeaseUse[]): Promise<void> {
    await this.#pool.migrate();
    const col = <K extends keyof LeaseUse>(k: K): Array<LeaseUse[K]> => leases.map((l) => l[k]);
    await this.#pool.bounded((sql) =>
      sql.begin(async (tx) => {
        // The unused part of each lease goes back; what was used stays granted.
        await tx`
          with u as (select * from unnest(${col('keyId')}::text[], ${col('kind')}::text[], ${col('period')}::text[], ${col('used')}::float8[]) as u(key_id, kind, period, used)),
          l as (
            delete from keyward_leases l using u where l.gateway = ${gateway} and l.key_id = u.key_id and l.kind = u.kind and l.period = u.period
            returning l.key_id, l.kind, l.period, l.held - u.used as unused)
          update keyward_allowances a set granted = a.granted - l.unused from l
          where a.key_id = l.key_id and a.kind = l.kind and a.period = l.period`;
      }),
    );
  }
}

/**
 * Leases past their expiry are ended; what they held stays granted. Their
 * holders may have admitted from them after their last report (a frozen
 * gateway wakes with requests it had admitted; a killed one's in flight
 * reached the upstream): giving back "held minus reported used" handed those
 * units out twice. What this costs is the unused part, refused for the rest
 * of the period (docs/limits.md, "Limits under faults").
 */
async function sweep(tx: postgres.TransactionSql): Promise<void> {
  await tx`delete from keyward_leases where expires < now()`;
}
