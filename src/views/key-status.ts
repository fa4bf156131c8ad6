// A key's own status (docs/limits.md, "A key's own status"): what
// `GET /keyward/key` answers a key holder. Where each of the key's limits
// stands (the figures a refusal would give), its alert thresholds, and its
// requests and cost by route today and this month. Only the key that asked,
// never a secret: the record's id, name, scope and expiry, nothing else of it.
import type { Principal } from '../keys/keyset.ts';
import type { LimitState, PeriodUse } from '../limits/limiter.ts';
import { periodUse, usageFrom, type Ledger, type RouteUsage } from '../ledger/ledger.ts';
import { policyFor } from '../limits/policy.ts';
import { within } from '../lib/deadline.ts';
import type { UsageRow, UsageStore } from '../ledger/store.ts';
import { micro } from '../lib/format.ts';
import { detach, neverRejects } from '../lib/detach.ts';
import { UNWATCHED, type Watch } from '../observe/outages.ts';

/** Where a key's figures come from: this process's limiter and ledger, or the primary and the store (workers, a fleet). */
export interface StatusSources {
  /** Requests and cost by route, and the period totals its limits read. */
  usage(keyId: string, now: number): RouteUsage | Promise<RouteUsage>;
  /** Where each limit stands; null when nobody could say (a worker whose primary did not answer). */
  limits(principal: Principal, use: PeriodUse, now: number): readonly LimitState[] | Promise<readonly LimitState[] | null>;
}

/** The unit of each route's cost (`usd`, `characters`), or null for a route that reports none. */
export type CostUnits = (route: string) => string | null;

/** The answer's body. */
function statusBody(principal: Principal, limits: readonly LimitState[] | null, usage: RouteUsage, units: CostUnits, now: number): unknown {
  const policy = policyFor(principal);
  const byRoute = (which: 'today' | 'month'): Record<string, { requests: number; cost: number; unit: string | null }> =>
    Object.fromEntries([...usage.routes].map(([route, u]) => [route, { requests: u[which].requests, cost: micro(u[which].cost), unit: units(route) }]));
  return {
    key: { id: principal.id, name: principal.name, routes: principal.routes ?? null, expires: principal.expires },
    limits:
      limits === null
        ? null
        : limits.map((l) => ({
            kind: l.kind,
            ...(l.route === null ? {} : { route: l.route }),
            value: l.value,
            unit: l.kind === 'budget' ? (units(l.route as string) ?? 'usd') : 'requests',
            ...(l.burst === undefined ? {} : { burst: l.burst }),
            used: l.used,
            remaining: l.remaining,
            ...(l.period === null ? {} : { period: l.period }),
            ...(l.window === null ? {} : { window: l.window }),
            resetsAt: l.resetsAt,
          })),
    alertAt: policy?.alerts ?? [],
    // The most one scraper run may be capped at (docs/limits.md, "Scraper runs"); null: a tenth of the budget unless the client asks.
    runCap: policy?.runCap ?? null,
    usage: { today: { day: usage.day, routes: byRoute('today') }, month: { month: usage.month, routes: byRoute('month') } },
    at: new Date(now).toISOString(),
    // The store could not be read: the figures are those last read (`asOf`; null: none yet) and this gateway's own since.
    ...(usage.stale === undefined ? {} : { stale: true, asOf: usage.stale.asOf }),
  };
}

/**
 * A key's usage read from the store (with workers or in a fleet, where other
 * processes count too): the key's rows of this month, read at most once per
 * `ttlMs` per key (calls in between share the read), plus what this process
 * counted and has not written yet.
 */
export class StoreView {
  readonly #store: Pick<UsageStore, 'rows'>;
  readonly #ledger: Pick<Ledger, 'unwritten'> | null;
  readonly #ttlMs: number;
  readonly #freshWithinMs: number;
  readonly #read = new Map<string, { at: number; seq: number; rows: Promise<UsageRow[]> }>();
  /** Each key's rows as last read, kept to answer from while the store does not. */
  readonly #last = new Map<string, { at: number; seq: number; rows: UsageRow[] }>();
  /** Reads in the order they started (two may start in the same millisecond). */
  #seq = 0;
  readonly #watch: Watch;

  /** `freshWithinMs`: how long a status waits for the store before it answers from what it last read, marked stale (Infinity: wait, and fail when the store does). */
  constructor(store: Pick<UsageStore, 'rows'>, ledger: Pick<Ledger, 'unwritten'> | null, ttlMs: number, freshWithinMs = 1_000, watch: Watch = UNWATCHED) {
    this.#watch = watch;
    this.#store = store;
    this.#ledger = ledger;
    this.#ttlMs = ttlMs;
    this.#freshWithinMs = freshWithinMs;
  }

  /** The key's figures as last read plus this gateway's unwritten, at once (null: never read); a read is started when they are older than the TTL. */
  cached(keyId: string, now: number): RouteUsage | null {
    const last = this.#last.get(keyId);
    if (last === undefined) {
      // Read now, for the next refusal.
      this.#refresh(keyId, now);
      return null;
    }
    if (Date.now() - last.at >= this.#ttlMs) this.#refresh(keyId, now);
    return usageFrom([...last.rows, ...(this.#ledger?.unwritten(keyId) ?? [])], now);
  }

  /** A read nobody waits for (the next refusal's figures); a store that fails it is seen where every read is (`#reading`). */
  #refresh(keyId: string, now: number): void {
    detach(this.usage(keyId, now), neverRejects);
  }

  /**
   * The key's rows read by a query that started now or later, waited for
   * whole (the store's own deadline bounds it): what `cached` answers next.
   * A read under way that started earlier is not enough: it may have begun
   * before another gateway's last write (a run settled there) and a cap
   * read from it would be a run behind. Rejects when the store does not
   * answer.
   */
  async refresh(keyId: string, now: number): Promise<void> {
    await this.#reading(keyId, now, true).rows;
  }

  async usage(keyId: string, now: number): Promise<RouteUsage> {
    const read = this.#reading(keyId, now);
    const unwritten = this.#ledger?.unwritten(keyId) ?? [];
    // The request path never waits on the store (keys and leases are in
    // memory); nor does a key asking where it stands: while the store is
    // down or frozen, it gets the figures last read and this gateway's own
    // not yet written, said to be stale (docs/limits.md, "A key's own status").
    if (!Number.isFinite(this.#freshWithinMs)) return usageFrom([...(await read.rows), ...unwritten], now);
    const rows = await within(
      read.rows.catch(() => null),
      this.#freshWithinMs,
      null,
    );
    if (rows !== null) return usageFrom([...rows, ...unwritten], now);
    const last = this.#last.get(keyId) ?? null;
    return { ...usageFrom([...(last?.rows ?? []), ...unwritten], now), stale: { asOf: last === null ? null : new Date(last.at).toISOString() } };
  }

  /** The key's read under way, or done within the TTL; else (or when `anew`) a new one, started now. */
  #reading(keyId: string, now: number, anew = false): { at: number; seq: number; rows: Promise<UsageRow[]> } {
    const month = usageFrom([], now).month;
    let read = this.#read.get(keyId);
    if (anew || read === undefined || Date.now() - read.at >= this.#ttlMs) {
      // Bounded: one key's rows of one month. The maps are bounded too (a flood of keys asking clears them).
      if (this.#read.size >= 10_000) this.#read.clear();
      if (this.#last.size >= 10_000) this.#last.clear();
      const r = { at: Date.now(), seq: ++this.#seq, rows: this.#store.rows({ keyId, since: `${month}-01` }) };
      read = r;
      this.#read.set(keyId, r);
      // A failed read is not kept: the next call tries again. Either way the store's health is seen.
      r.rows.then(
        (rows) => {
          // Reads may end out of order: an older one never replaces a newer one's rows.
          if ((this.#last.get(keyId)?.seq ?? -Infinity) < r.seq) this.#last.set(keyId, { at: r.at, seq: r.seq, rows });
          this.#watch.ok();
        },
        (err: unknown) => {
          this.#read.delete(keyId);
          this.#watch.failed(err);
        },
      );
    }
    return read;
  }
}

/** The answer for `principal`: at once when every source answers from memory, else once they have. */
export function keyStatus(sources: StatusSources, principal: Principal, units: CostUnits, now: number): unknown {
  const usage = sources.usage(principal.id, now);
  const withUsage = (u: RouteUsage): unknown => {
    const limits = sources.limits(principal, periodUse(u), now);
    return limits instanceof Promise ? limits.then((l) => statusBody(principal, l, u, units, now)) : statusBody(principal, limits, u, units, now);
  };
  return usage instanceof Promise ? usage.then(withUsage) : withUsage(usage);
}
