// What the usage page shows (docs/limits.md, "The usage page"), read from
// the ledger's store with bounded, aggregated queries: totals per day and
// route over 30 days, totals per key and route for a day or a month, never
// a scan of the ledger's whole history.
import type { KeyRecord } from '../keys/keyset.ts';
import { periodOf, policyFor } from '../limits/policy.ts';
import type { DayTotal, KeyTotal, ReportQueries, UsageRow, UsageStore } from '../ledger/store.ts';

/** The same aggregates from a store's rows (the memory store's, or any store without its own). */
function fromRows(store: Pick<UsageStore, 'rows'>): ReportQueries {
  const sum = <K extends string>(rows: UsageRow[], key: (r: UsageRow) => K): Map<K, { requests: number; cost: number; row: UsageRow }> => {
    const out = new Map<K, { requests: number; cost: number; row: UsageRow }>();
    for (const r of rows) {
      const k = key(r);
      const t = out.get(k) ?? { requests: 0, cost: 0, row: r };
      t.requests += r.requests;
      t.cost += r.cost;
      out.set(k, t);
    }
    return out;
  };
  return {
    daily: async (since, keyId, route) => {
      const rows = await store.rows({ since, ...(keyId === null ? {} : { keyId }), ...(route === null ? {} : { route }) });
      return [...sum(rows, (r) => `${r.day}\u0000${r.route}`).values()].map((t) => ({
        day: t.row.day,
        route: t.row.route,
        requests: t.requests,
        cost: t.cost,
      }));
    },
    byKey: async (since, keyIds) => {
      const only = keyIds === null ? null : new Set(keyIds);
      const rows = (await store.rows({ since })).filter((r) => only === null || only.has(r.keyId));
      return [...sum(rows, (r) => `${r.keyId}\u0000${r.route}`).values()].map((t) => ({
        keyId: t.row.keyId,
        route: t.row.route,
        requests: t.requests,
        cost: t.cost,
      }));
    },
  };
}

export interface Report {
  readonly days: readonly string[];
  readonly daily: readonly DayTotal[];
  /** Today's keys by requests, most first (at most 10). */
  readonly top: ReadonlyArray<{
    readonly key: KeyRecord | null;
    readonly keyId: string;
    readonly requests: number;
    readonly cost: Readonly<Record<string, number>>;
  }>;
  /** Keys at or past `NEAR` of a quota or budget this period, most used first. */
  readonly near: ReadonlyArray<{ readonly key: KeyRecord; readonly limit: string; readonly used: number; readonly value: number; readonly share: number }>;
  /** `route`: the route shown, null for all or for a `routeText` that names none. */
  readonly filter: { readonly key: KeyRecord | null; readonly keyText: string | null; readonly route: string | null; readonly routeText: string | null };
}

/** A key is listed as near its limit from this share of it. */
const NEAR = 0.8;
const DAYS = 30;

/** The page's figures at `now` for `filter` (a key by id or name, a route). */
async function buildReport(
  q: ReportQueries,
  keys: readonly KeyRecord[],
  routes: readonly string[],
  filter: { key: string | null; route: string | null },
  now = Date.now(),
  runRoutes: readonly string[] = [],
): Promise<Report> {
  const today = periodOf('day', now).key;
  const month = `${periodOf('month', now).key}-01`;
  const days = Array.from({ length: DAYS }, (_, i) => new Date(Date.parse(today) - (DAYS - 1 - i) * 86_400_000).toISOString().slice(0, 10));
  const byId = new Map(keys.map((k) => [k.id, k]));
  const key = filter.key === null ? null : (byId.get(filter.key) ?? keys.find((k) => k.name === filter.key && k.revoked === null) ?? null);
  const keyId = filter.key === null ? null : (key?.id ?? null);
  const route = filter.route === null ? null : routes.includes(filter.route) ? filter.route : null;
  // A key or route the filter names but nobody has: nothing, rather than everything (and nothing asked of the store).
  const nothing = (filter.key !== null && keyId === null) || (filter.route !== null && route === null);
  const limited = keys.filter((k) => {
    const p = policyFor(k);
    return k.revoked === null && p !== null && (p.quota !== null || p.budgets.size > 0);
  });
  const [daily, todays, months] = await Promise.all([
    nothing ? Promise.resolve([]) : q.daily(days[0] as string, keyId, route),
    q.byKey(today, null),
    limited.length === 0
      ? Promise.resolve([])
      : q.byKey(
          month,
          limited.map((k) => k.id),
        ),
  ]);
  const perKey = new Map<string, { requests: number; cost: Record<string, number> }>();
  for (const t of todays) {
    const e = perKey.get(t.keyId) ?? { requests: 0, cost: {} };
    e.requests += t.requests;
    if (t.cost !== 0) e.cost[t.route] = (e.cost[t.route] ?? 0) + t.cost;
    perKey.set(t.keyId, e);
  }
  const top = [...perKey]
    .sort((a, b) => b[1].requests - a[1].requests)
    .slice(0, 10)
    .map(([id, e]) => ({ key: byId.get(id) ?? null, keyId: id, requests: e.requests, cost: e.cost }));
  // Today's totals of every key hold those of the keys with limits.
  const near = nearLimits(limited, todays, months, runRoutes);
  near.sort((a, b) => b.share - a.share);
  return {
    days,
    daily,
    top,
    near: near.slice(0, 50),
    filter: { key, keyText: filter.key, route: route === filter.route ? route : null, routeText: filter.route },
  };
}

/** The keys at or past NEAR of a quota or budget this period, from their totals of today and this month. */
function nearLimits(
  limited: readonly KeyRecord[],
  dayOfLimited: readonly KeyTotal[],
  months: readonly KeyTotal[],
  runRoutes: readonly string[],
): Array<Report['near'][number]> {
  const near: Array<Report['near'][number]> = [];
  // Indexed once: a lookup per key and limit, whatever the number of keys.
  const index = (rows: readonly KeyTotal[]): Map<string, KeyTotal[]> => {
    const m = new Map<string, KeyTotal[]>();
    for (const r of rows) {
      const list = m.get(r.keyId);
      if (list === undefined) m.set(r.keyId, [r]);
      else list.push(r);
    }
    return m;
  };
  const byMonth = index(months);
  const byDay = index(dayOfLimited);
  const total = (rows: Map<string, KeyTotal[]>, id: string, route: string | null, field: 'requests' | 'cost'): number =>
    (rows.get(id) ?? []).filter((r) => route === null || r.route === route).reduce((n, r) => n + r[field], 0);
  for (const k of limited) {
    const p = policyFor(k);
    if (p === null) continue;
    if (p.quota !== null) {
      const used = total(p.quota.period === 'day' ? byDay : byMonth, k.id, null, 'requests');
      if (used >= NEAR * p.quota.count)
        near.push({ key: k, limit: `quota ${p.quota.count}/${p.quota.period}`, used, value: p.quota.count, share: used / p.quota.count });
    }
    for (const [route, b] of p.budgets) {
      const used = total(b.period === 'day' ? byDay : byMonth, k.id, route, 'cost');
      // A run cap belongs to the budget whose runs it caps (docs/limits.md, "Scraper runs").
      const cap = p.runCap !== null && runRoutes.includes(route) ? `, runs capped at ${p.runCap}` : '';
      if (used >= NEAR * b.amount) near.push({ key: k, limit: `budget ${route} ${b.amount}/${b.period}${cap}`, used, value: b.amount, share: used / b.amount });
    }
  }
  return near;
}

/**
 * The usage page's source for the admin listener: the store's own aggregates
 * (or its rows), the key records by `keys`, each route's cost unit.
 */
export function usagePage(
  store: UsageStore,
  keys: () => readonly KeyRecord[] | Promise<readonly KeyRecord[]>,
  routes: readonly string[],
  units: (route: string) => string | null,
  render: (r: Report, routes: readonly string[], units: (route: string) => string | null, at: string) => string,
  runRoutes: readonly string[] = [],
): (params: URLSearchParams) => Promise<string> {
  const q = store.report ?? fromRows(store);
  return async (params) => {
    const route = params.get('route');
    const key = params.get('key');
    const now = Date.now();
    const report = await buildReport(
      q,
      await keys(),
      routes,
      { key: key === null || key.trim() === '' ? null : key.trim(), route: route === null || route === '' ? null : route },
      now,
      runRoutes,
    );
    return render(report, routes, units, new Date(now).toISOString());
  };
}
