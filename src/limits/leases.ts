// A gateway's part of its fleet's quotas and budgets (docs/limits.md,
// "Across a fleet"): leases claimed from the shared store (keys/pg-leases.ts)
// and spent locally, so a key far from its limit costs no round trip and the
// fleet together never admits more than the limit. A claim asks for a share
// of what is left (a quarter of it divided among the live gateways, at least
// what this request needs), so chunks shrink to one unit near the end. What
// was used is reported and the leases renewed at every flush; what was not
// used goes back when its holder gives it back (a drain, a period's end).
// A lease its holder stops renewing (a crash, a freeze, a cut path) expires
// and is swept, and what it held stays granted: whatever its holder admitted
// and had not reported yet stays spent, so no fault hands a unit out twice;
// what a fault costs is the unused part of the leases held (docs/limits.md,
// "Limits under faults"). A holder whose lease was swept while it was away
// writes it back at its next renewal (it is still granted), so a drain
// later gives back exactly what it did not use. While the store is
// unreachable a gateway admits what its leases still hold, and no more.
import { periodOf, type Period } from './policy.ts';
import { floorMicro } from '../lib/format.ts';
import { detach, neverRejects } from '../lib/detach.ts';
import { UNWATCHED, type Watch } from '../observe/outages.ts';

export interface LeaseUse {
  readonly keyId: string;
  /** `quota`, or `budget:<route>`. */
  readonly kind: string;
  /** The period's key (`2026-11-24`, `2026-11`), by the database's clock. */
  readonly period: string;
  readonly used: number;
  /** What the holder was granted, as it knows it. */
  readonly held: number;
  /** Spent beyond `held` (a budget's estimate fell short) and not yet added to the allowance. */
  readonly over: number;
}

/** The allowance of a key's quota, as lease stores name its kind. */
export const QUOTA = 'quota';
/** The allowance of a key's budget on `route`, as lease stores name its kind. */
const KINDS = new Map<string, string>();
/** Made once per route: admission asks for it on every request of a key with a budget. */
export const budgetKind = (route: string): string => {
  let kind = KINDS.get(route);
  if (kind === undefined) KINDS.set(route, (kind = `budget:${route}`));
  return kind;
};

/** One allowance (key, kind, period): the composite each lease is kept by. */
type AllowanceId = string & { readonly __allowance: true };
const allowanceId = (keyId: string, kind: string, period: string): AllowanceId => `${keyId}\u0000${kind}\u0000${period}` as AllowanceId;

/** One key's allowance of one kind (`quota`, `budget:ROUTE`) in one period. */
export interface Allowance {
  readonly keyId: string;
  readonly kind: string;
  readonly period: string;
}

/** What a claim asks for: `share` of what is left (whole units when `whole`), at least `least`. */
export interface Want {
  readonly least: number;
  readonly share: number;
  readonly whole: boolean;
}

/** What a claim got, and the store's clock when it did. */
export interface Claimed {
  readonly got: number;
  readonly now: number;
}

export interface LeaseStore {
  /** Claim up to what is left of `limit`: `share` of it (whole units when `whole`), at least `least`. The amount got, and the store's clock. */
  claim(gateway: string, lease: Allowance, want: Want, limit: number, ttlS: number): Promise<Claimed>;
  /**
   * Report what each lease used and extend it, writing back a lease that was
   * swept meanwhile (its units are still granted); leases past their expiry
   * (anyone's) are swept, what they held staying granted. The store's clock,
   * and how many of these leases had been swept.
   */
  renew(gateway: string, leases: readonly LeaseUse[], ttlS: number): Promise<{ now: number; lost: number }>;
  /** Give back what these leases did not use, and end them. */
  release(gateway: string, leases: readonly LeaseUse[]): Promise<void>;
  /** Share what a call costs per route: this gateway's figures written, the fleet's read back (a fleet's store only). */
  costs?(mine: ReadonlyArray<readonly [string, number]>): Promise<Array<readonly [string, number]>>;
}

/** A limiter's learnt costs per call by route, and how it takes the fleet's for routes it has not seen. */
export interface CostShare {
  learnt(): ReadonlyMap<string, number>;
  adopt(route: string, perCall: number): void;
}

/** Time as the fleet reads it: this machine's clock corrected by the store's, learnt at each claim and renewal. */
export class Clock {
  offset = 0;
  readonly local: () => number;
  constructor(local: () => number = Date.now) {
    this.local = local;
  }
  now(): number {
    return this.local() + this.offset;
  }
  /** The store said it is `storeNow` (read mid-round-trip). */
  learn(storeNow: number): void {
    this.offset = storeNow - this.local();
  }
}

interface Lease {
  readonly keyId: string;
  readonly kind: string;
  readonly period: string;
  held: number;
  used: number;
  /** Taken by requests in flight, not yet used. */
  reserved: number;
  claiming: Promise<void> | null;
  /** The last claim got nothing: refuse without asking again until the next renewal. */
  exhausted: boolean;
  /** The last claim found the store unreachable: not decided here (503) without asking again until the next renewal. */
  failed: boolean;
}

/**
 * What taking from an allowance came to, one tagged result for every
 * caller: `taken` (`amount` of it, now reserved for the request), `spent`
 * (nothing left), `unreachable` (more is needed and the store did not answer
 * the last claim: docs/limits.md, "Admission under a store that does not
 * answer"), or `claiming` (more is being claimed: ask again once `claimed`
 * resolves; it never rejects).
 */
export type Took =
  | { readonly kind: 'taken'; readonly amount: number }
  | { readonly kind: 'spent' }
  | { readonly kind: 'unreachable' }
  | { readonly kind: 'claiming'; readonly claimed: Promise<void> };

const SPENT: Took = { kind: 'spent' };
const UNREACHABLE: Took = { kind: 'unreachable' };
/** A quota's unit, the most common take: one object for all of them. */
const TAKEN_ONE: Took = { kind: 'taken', amount: 1 };
const taken = (amount: number): Took => (amount === 1 ? TAKEN_ONE : { kind: 'taken', amount });
const claiming = (claimed: Promise<void>): Took => ({ kind: 'claiming', claimed });

/**
 * Where an admission takes a key's quota units and budget from: a fleet's
 * or one machine's leases (`Leases`), or, counting in memory, what
 * requests in flight hold (`InFlight`). Both answer the same calls, so the
 * limiter checks a quota and a budget in one place whatever stands behind.
 */
export interface Allowances {
  /** The moment periods are read at: the fleet's clock for leases, the request's own time in memory. */
  at(now: number): number;
  periodKey(period: Period, at: number): string;
  /** What requests in flight here have taken of `keyId`'s `kind` this period. */
  reserved(keyId: string, kind: string, period: string): number;
  take(keyId: string, kind: string, period: string, limit: number, amount: number): Took;
  takeUpTo(keyId: string, kind: string, period: string, limit: number, want: number): Took;
  /** Give back what a take reserved: `used` of it was spent. */
  reconcile(keyId: string, kind: string, period: string, reserved: number, used: number): void;
}

/**
 * Counting in memory (no leases): the ledger's period totals are checked
 * by the limiter, and what requests in flight took is held here so that
 * overlapping requests see each other. Nothing is claimed, so a take that
 * the limiter's check let through always takes. The period is not part of
 * the key: a request still in flight across midnight keeps counting until
 * it ends, when the ledger counts it.
 */
export class InFlight implements Allowances {
  /** By key, then kind: no string is built per request. */
  readonly #held = new Map<string, Map<string, number>>();
  at(now: number): number {
    return now;
  }
  periodKey(): string {
    return '';
  }
  reserved(keyId: string, kind: string): number {
    return this.#held.get(keyId)?.get(kind) ?? 0;
  }
  take(keyId: string, kind: string, _period: string, _limit: number, amount: number): Took {
    let mine = this.#held.get(keyId);
    if (mine === undefined) this.#held.set(keyId, (mine = new Map<string, number>()));
    mine.set(kind, (mine.get(kind) ?? 0) + amount);
    return taken(amount);
  }
  takeUpTo(keyId: string, kind: string, period: string, limit: number, want: number): Took {
    return this.take(keyId, kind, period, limit, want);
  }
  /** What was used is the ledger's to count; only the reservation goes. */
  reconcile(keyId: string, kind: string, _period: string, reserved: number, _used: number): void {
    const mine = this.#held.get(keyId);
    if (mine === undefined) return;
    const left = (mine.get(kind) ?? 0) - reserved;
    if (left > 1e-9) mine.set(kind, left);
    else if (mine.delete(kind) && mine.size === 0) this.#held.delete(keyId);
  }
}

export class Leases implements Allowances {
  readonly #store: LeaseStore;
  readonly #gateway: string;
  readonly clock: Clock;
  readonly #live: () => number;
  readonly #ttlS: number;
  readonly #leases = new Map<AllowanceId, Lease>();
  #timer: NodeJS.Timeout | null = null;
  #renewing: Promise<void> | null = null;
  #stopped = false;
  /** Round trips made for claims (the bench reads it). */
  claims = 0;
  /** Each route's cost per call, shared with the fleet at each renewal (null: not shared). */
  readonly #costs: CostShare | null;
  readonly #sharedCosts = new Map<string, number>();
  /** Told when a renewal found leases of this gateway swept (it was frozen or cut off past their expiry). */
  onLost: (count: number) => void = () => undefined;
  /** Renewals and claims that fail are seen (observe/outages.ts): logged when an outage starts and ends, counted. */
  readonly #watch: { readonly renewal: Watch; readonly claim: Watch };

  constructor(
    store: LeaseStore,
    gateway: string,
    clock: Clock,
    live: () => number,
    ttlS: number,
    costs: CostShare | null = null,
    watch: { readonly renewal: Watch; readonly claim: Watch } = { renewal: UNWATCHED, claim: UNWATCHED },
  ) {
    this.#watch = watch;
    this.#costs = costs;
    this.#store = store;
    this.#gateway = gateway;
    this.clock = clock;
    this.#live = live;
    this.#ttlS = ttlS;
  }

  /** Learn the store's clock (a period is the fleet's, not this machine's), then renew every `everyMs` (the ledger's flush interval). */
  async start(everyMs: number): Promise<void> {
    // A store down at start: this machine's clock until the first renewal that reaches it.
    await this.#renewSeen();
    this.#timer = setInterval(() => detach(this.#renewSeen(), neverRejects), everyMs);
    this.#timer.unref();
  }

  /** The period key of `period` now, by the fleet's clock. */
  periodKey(period: Period, now = this.clock.now()): string {
    return periodOf(period, now).key;
  }

  /** Periods are the fleet's: read by its clock, whatever time the request carries. */
  at(): number {
    return this.clock.now();
  }

  /**
   * Take `amount` of `limit` for `keyId`'s `kind` this period (`Took`):
   * `claiming` when this gateway's lease must first claim more (the caller
   * asks again once the claim is answered). A budget is taken
   * while anything is left, whatever the estimate: the same rule as one
   * gateway's (admitted while spent + reserved is below the amount).
   */
  take(keyId: string, kind: string, period: string, limit: number, amount: number): Took {
    const lease = this.#lease(keyId, kind, period);
    const free = lease.held - lease.used - lease.reserved;
    const whole = kind === 'quota';
    if (whole ? free >= amount : free > 1e-9) {
      lease.reserved += amount;
      return taken(amount);
    }
    if (lease.exhausted) return SPENT;
    if (lease.failed) return UNREACHABLE;
    return claiming(this.#claim(lease, whole ? amount : Math.max(amount, 1e-9), whole, limit));
  }

  /**
   * Take `want` of a budget's `limit` for one paid start (a scraper run's
   * cap), or as much of it as this gateway can still hold (`taken` with
   * the amount; `spent` when that is nothing), or `claiming` when more must
   * first be claimed. What is
   * taken is this gateway's alone, so the caps in flight across the fleet
   * never add up to more than what is left of the budget.
   */
  takeUpTo(keyId: string, kind: string, period: string, limit: number, want: number): Took {
    const lease = this.#lease(keyId, kind, period);
    const free = lease.held - lease.used - lease.reserved;
    if (free >= want - 1e-9) {
      lease.reserved += want;
      return taken(want);
    }
    if (lease.failed) return UNREACHABLE;
    if (!lease.exhausted) return claiming(this.#claim(lease, want - free, false, limit));
    const got = floorMicro(Math.max(0, free));
    if (got <= 0) return SPENT;
    lease.reserved += got;
    return taken(got);
  }

  #lease(keyId: string, kind: string, period: string): Lease {
    const id = allowanceId(keyId, kind, period);
    let lease = this.#leases.get(id);
    if (lease === undefined) {
      lease = { keyId, kind, period, held: 0, used: 0, reserved: 0, claiming: null, exhausted: false, failed: false };
      this.#leases.set(id, lease);
    }
    return lease;
  }

  /**
   * One claim at a time per lease: a request that arrives while one is out
   * waits for it and asks again, taking from what it brought before
   * claiming anew (a claim for units nobody then needs would sit idle while
   * other gateways refuse).
   */
  #claim(l: Lease, least: number, whole: boolean, limit: number): Promise<void> {
    l.claiming ??= (async () => {
      try {
        this.claims++;
        const { got, now } = await this.#store.claim(this.#gateway, l, { least, share: 1 / (4 * Math.max(1, this.#live())), whole }, limit, this.#ttlS);
        this.clock.learn(now);
        l.held += got;
        if (got === 0) l.exhausted = true;
        this.#watch.claim.ok();
      } catch (err) {
        // Not answered, or a bug (logged as one): either way only what is
        // held may be admitted, and more is not decided here until a
        // renewal reaches the store. Failing closed is right for both.
        l.failed = true;
        this.#watch.claim.failed(err);
      } finally {
        l.claiming = null;
      }
    })();
    return l.claiming;
  }

  /** What requests in flight here have taken from `keyId`'s `kind` lease this period. */
  reserved(keyId: string, kind: string, period: string): number {
    return this.#leases.get(allowanceId(keyId, kind, period))?.reserved ?? 0;
  }

  /** Give back what `take` reserved: `used` of it was spent (a forwarded request's unit, a call's reported cost). */
  reconcile(keyId: string, kind: string, period: string, reserved: number, used: number): void {
    const lease = this.#leases.get(allowanceId(keyId, kind, period));
    if (lease === undefined) return;
    lease.reserved = Math.max(0, lease.reserved - reserved);
    lease.used += used;
  }

  /** A renewal whose failure is seen, and that never rejects: the next one is at the next flush. */
  #renewSeen(): Promise<void> {
    return this.renew().then(
      () => this.#watch.renewal.ok(),
      (err: unknown) => this.#watch.renewal.failed(err),
    );
  }

  /** Report, extend, sweep the dead; leases of periods that ended are given back. Claims may be tried again. One at a time, none after `stop`. */
  renew(): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    this.#renewing ??= this.#renew().finally(() => (this.#renewing = null));
    return this.#renewing;
  }

  async #renew(): Promise<void> {
    const all = [...this.#leases.values()].filter((l) => l.held > 0 || l.used > 0);
    const now = this.clock.now();
    const current = (l: Lease): boolean => l.period === this.periodKey(l.period.length === 7 ? 'month' : 'day', now) || l.reserved > 0;
    const ended = all.filter((l) => !current(l));
    const live = all.filter(current);
    const { now: storeNow, lost } = await this.#store.renew(this.#gateway, live.map(use), this.#ttlS);
    this.clock.learn(storeNow);
    // What was spent beyond the grant is in the allowance now: the grant covers it.
    for (const l of live) l.held = Math.max(l.held, l.used);
    if (lost > 0) this.onLost(lost);
    if (this.#costs !== null && this.#store.costs !== undefined) {
      // What calls cost, learnt anywhere in the fleet: written when learnt here, read where not.
      const mine = [...this.#costs.learnt()].filter(([route, c]) => this.#sharedCosts.get(route) !== c);
      for (const [route, perCall] of await this.#store.costs(mine)) {
        this.#sharedCosts.set(route, perCall);
        this.#costs.adopt(route, perCall);
      }
    }
    if (ended.length > 0) {
      await this.#store.release(this.#gateway, ended.map(use));
      for (const l of ended) this.#leases.delete(allowanceId(l.keyId, l.kind, l.period));
    }
    for (const l of this.#leases.values()) [l.exhausted, l.failed] = [false, false];
  }

  /** Drain: stop renewing and give back every lease's unused part. */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== null) clearInterval(this.#timer);
    // A renewal under way would write the leases back after they were given back.
    await this.#renewing?.catch(() => undefined);
    const all = [...this.#leases.values()].filter((l) => l.held > 0 || l.used > 0);
    if (all.length > 0) await this.#store.release(this.#gateway, all.map(use));
    this.#leases.clear();
  }
}

const use = (l: Lease): LeaseUse => ({ keyId: l.keyId, kind: l.kind, period: l.period, used: l.used, held: l.held, over: Math.max(0, l.used - l.held) });
