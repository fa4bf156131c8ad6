// Capacity shared by a fleet (docs/credentials.md, "Capacity"): each
// credential's concurrency (and each rate's burst) is split between the
// gateways as leases in the shared store. A gateway forwards only on what
// its leases hold, so the fleet together never passes the account's limit.
// Every rebalance (four times a second, and at once when a request finds no
// room) reports what this gateway uses and wants and takes its share: what
// it wants when everyone's wants fit, with what is left split between the
// gateways; a share by demand when they do not. A gateway gives back down
// to its share as its requests end, never below what is in flight, so room
// moves to where requests wait within a second or two rebalances.
//
// Leases outlive their last renewal by KEYWARD_LEASE_TTL. A gateway stops
// using what it holds once that much time (less a margin) has passed since
// its last renewal began, before the store may hand it to another; a
// frozen, killed or cut-off gateway's share comes back to the others only
// after its lease ended, and it takes nothing new until a renewal reaches
// the store again.
import type { Capacity, Demand } from './capacity.ts';
import { detach, neverRejects } from '../lib/detach.ts';
import { UNWATCHED, type Watch } from '../observe/outages.ts';

/** How often a fleet gateway rebalances its shares, ms. */
export const REBALANCE_MS = 250;

/** Another gateway's lease on one credential's capacity, as the store holds it. */
export interface Other {
  readonly held: number;
  readonly want: number;
}

/**
 * What this gateway may hold of a capacity of `limit`, given what it uses
 * and wants and the other live gateways' leases. Pure. Never more than what
 * the others leave free; never less than what is in use here, unless the
 * others hold that much (a gateway back from a freeze).
 */
export function shareOf(limit: number, mine: { readonly inUse: number; readonly want: number }, others: readonly Other[]): number {
  const othersHeld = others.reduce((n, o) => n + o.held, 0);
  const live = others.filter((o) => o.held > 0 || o.want > 0).length + 1;
  const wants = others.reduce((n, o) => n + o.want, 0) + mine.want;
  let target: number;
  if (wants <= limit) target = mine.want + Math.floor((limit - wants) / live);
  else target = mine.want === 0 ? 0 : Math.max(1, Math.floor((limit * mine.want) / wants));
  return Math.max(0, Math.min(Math.max(mine.inUse, target), limit - othersHeld));
}

/** One credential's capacity as a rebalance decides it. */
export interface Settled {
  readonly route: string;
  readonly label: number;
  readonly kind: Demand['kind'];
  readonly held: number;
  readonly want: number;
}

export interface ShareStore {
  /**
   * In one transaction, with every credential of `demands` locked: leases
   * past their expiry swept, the others' read, `decide` called with them
   * (synchronously: it applies any shrink here before the store records it)
   * and what it returns written, extended by `ttlS`.
   */
  rebalance(gateway: string, demands: readonly Demand[], decide: (others: ReadonlyMap<string, readonly Other[]>) => Settled[], ttlS: number): Promise<void>;
  /** Give back everything this gateway holds. */
  release(gateway: string): Promise<void>;
}

/** The key of one credential's capacity of one kind. */
export const shareKey = (route: string, label: number, kind: string): string => `${route}\u0000${label}\u0000${kind}`;

/** A fleet gateway's leases on the capacities of its routes' credentials. */
export class FleetShares {
  readonly #capacity: Capacity;
  readonly #store: ShareStore;
  readonly #gateway: string;
  readonly #ttlMs: number;
  #watch: Watch;
  #timer: ReturnType<typeof setInterval> | null = null;
  #running: Promise<void> | null = null;
  #again = false;
  #stopped = false;
  /** The clock validity is read by: the Capacity's own (performance.now(), which runs on through a freeze). */
  readonly #clock: () => number;

  constructor(capacity: Capacity, store: ShareStore, gateway: string, ttlMs: number, watch: Watch = UNWATCHED, clock: () => number = () => performance.now()) {
    this.#clock = clock;
    this.#capacity = capacity;
    this.#store = store;
    this.#gateway = gateway;
    this.#ttlMs = ttlMs;
    this.#watch = watch;
    capacity.shareWithFleet(() => this.now());
  }

  /** Failed rebalances are seen from here on (observe/outages.ts). */
  watchWith(watch: Watch): void {
    this.#watch = watch;
  }

  start(everyMs = REBALANCE_MS): void {
    this.#timer = setInterval(() => this.now(), everyMs);
    this.#timer.unref();
    this.now();
  }

  /** Rebalance now (a request found no room), or once more when the one under way ends. */
  now(): void {
    if (this.#stopped) return;
    if (this.#running !== null) {
      this.#again = true;
      return;
    }
    this.#running = this.#rebalance().finally(() => {
      this.#running = null;
      if (this.#again) {
        this.#again = false;
        this.now();
      }
    });
    detach(this.#running, neverRejects);
  }

  async #rebalance(): Promise<void> {
    const demands = this.#capacity.demands();
    if (demands.length === 0) return;
    // Sure until the store's expiry at the earliest: it is at least this far from when the renewal was sent.
    const began = this.#clock();
    let grown: Settled[] = [];
    try {
      await this.#store.rebalance(
        this.#gateway,
        demands,
        (others) => {
          const settled = this.#decide(demands, others);
          // A shrink applies here before the store records it: nobody else can be given what this gateway may still use.
          grown = settled.filter((s) => s.held > this.#capacity.holding(s.route, s.label, s.kind));
          for (const s of settled) if (!grown.includes(s)) this.#capacity.hold(s.route, s.label, s.kind, s.held);
          return settled;
        },
        Math.max(1, Math.ceil(this.#ttlMs / 1000)),
      );
    } catch (err) {
      this.#watch.failed(err);
      return;
    }
    this.#watch.ok();
    for (const s of grown) this.#capacity.hold(s.route, s.label, s.kind, s.held);
    this.#capacity.renewedUntil(began + this.#ttlMs - Math.min(1_000, this.#ttlMs / 4));
  }

  /** Each credential's share, from what this gateway uses and wants now (read again: requests moved while the store was asked). */
  #decide(asked: readonly Demand[], others: ReadonlyMap<string, readonly Other[]>): Settled[] {
    const now = new Map(this.#capacity.demands().map((d) => [shareKey(d.route, d.label, d.kind), d]));
    return asked.map((d) => {
      const cur = now.get(shareKey(d.route, d.label, d.kind)) ?? d;
      const want = Math.max(cur.want, d.want);
      const held = shareOf(d.limit, { inUse: cur.inUse, want }, others.get(shareKey(d.route, d.label, d.kind)) ?? []);
      return { route: d.route, label: d.label, kind: d.kind, held, want };
    });
  }

  /** Drain: stop rebalancing and give back everything held. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== null) clearInterval(this.#timer);
    await this.#running?.catch(() => undefined);
    await this.#store.release(this.#gateway);
  }
}
