// Leases on the routes' accounts' capacity in PostgreSQL (capacity/fleet.ts):
// a row per credential and kind to lock, and a lease per gateway. Every
// rebalance locks the credentials it speaks of (in one order, so two
// gateways never wait on each other), sweeps leases past their expiry by
// the database's clock, reads the others' and writes its own, so the leases
// of one credential never add up to more than its limit.
import type { Database } from '../keys/store.ts';
import type { Demand } from './capacity.ts';
import { shareKey, type Other, type Settled, type ShareStore } from './fleet.ts';

export class PgShareStore implements ShareStore {
  readonly #pool: Database;

  constructor(pool: Database) {
    this.#pool = pool;
  }

  async rebalance(
    gateway: string,
    demands: readonly Demand[],
    decide: (others: ReadonlyMap<string, readonly Other[]>) => Settled[],
    ttlS: number,
  ): Promise<void> {
    await this.#pool.migrate();
    const sorted = [...demands].sort((a, b) => shareKey(a.route, a.label, a.kind).localeCompare(shareKey(b.route, b.label, b.kind)));
    const routes = sorted.map((d) => d.route);
    const labels = sorted.map((d) => d.label);
    const kinds = sorted.map((d) => d.kind);
    await this.#pool.bounded((sql) =>
      sql.begin(async (tx) => {
        await tx`insert into keyward_capacity (route, label, kind) select * from unnest(${routes}::text[], ${labels}::int[], ${kinds}::text[]) on conflict do nothing`;
        // Locked in one order: rebalances of the same credentials queue instead of deadlocking.
        await tx`
          select 1 from keyward_capacity c
          join unnest(${routes}::text[], ${labels}::int[], ${kinds}::text[]) as u(route, label, kind) on c.route = u.route and c.label = u.label and c.kind = u.kind
          order by c.route, c.label, c.kind for update of c`;
        await tx`delete from keyward_capacity_leases where expires < now()`;
        const rows = await tx<Array<{ route: string; label: number; kind: string; held: number; want: number }>>`
          select l.route, l.label, l.kind, l.held, l.want from keyward_capacity_leases l
          join unnest(${routes}::text[], ${labels}::int[], ${kinds}::text[]) as u(route, label, kind) on l.route = u.route and l.label = u.label and l.kind = u.kind
          where l.gateway <> ${gateway}`;
        const others = new Map<string, Other[]>();
        for (const r of rows) {
          const k = shareKey(r.route, r.label, r.kind);
          others.set(k, [...(others.get(k) ?? []), { held: r.held, want: r.want }]);
        }
        const settled = decide(others);
        await tx`
          insert into keyward_capacity_leases (gateway, route, label, kind, held, want, expires)
          select ${gateway}, * , now() + make_interval(secs => ${ttlS}) from unnest(
            ${settled.map((s) => s.route)}::text[], ${settled.map((s) => s.label)}::int[], ${settled.map((s) => s.kind)}::text[],
            ${settled.map((s) => s.held)}::int[], ${settled.map((s) => s.want)}::int[])
          on conflict (gateway, route, label, kind) do update set held = excluded.held, want = excluded.want, expires = excluded.expires`;
        await tx`delete from keyward_capacity_leases where gateway = ${gateway} and held = 0 and want = 0`;
      }),
    );
  }

  async release(gateway: string): Promise<void> {
    await this.#pool.bounded((sql) => sql`delete from keyward_capacity_leases where gateway = ${gateway}`);
  }
}
