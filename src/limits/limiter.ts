// Admission against a key's limits (docs/limits.md): an admission or the
// refusal to answer with (429). Nothing is consumed by a refused request: the
// checks run first, then the admission takes its token, its slot and its
// reservations. Quotas and budgets are reserved here, at admission, and
// reconciled when the request is over: overlapping requests see each other's
// reservations, so N at once cannot pass a quota that has one unit left.
// `done` is called once the response is finished or the client left,
// whichever comes first: the slot comes back, a request that never reached
// the upstream gives back its quota unit and budget reservation, and a
// budget's reservation becomes the cost the upstream reported (which the
// ledger counts in the same tick).
import { budgetKind, InFlight, QUOTA, type Allowances, type Took } from './leases.ts';
import { learn, RouteCosts } from './route-costs.ts';
import { periodOf, type Period, type Policy } from './policy.ts';
import { floorMicro, micro, rfc3339 } from '../lib/format.ts';
import { within } from '../lib/deadline.ts';
import { detach, neverRejects } from '../lib/detach.ts';

/**
 * A budget is spent when what is left of it rounds to nothing at the
 * micro-unit (costs are in US dollars to the micro-dollar, or whole units).
 * Spend is a sum of decimal costs in binary floating point, and its order
 * moves the last bit: runs of 0.3, 0.3, 0.3 and 0.1 add up to
 * 0.9999999999999999 in one order and 1 in another, and "spent < amount"
 * admitted one more run (capped at nothing) against a 1 USD budget
 * already spent, as the gateway that settled each run happened to order
 * them.
 */
const budgetSpent = (amount: number, spent: number): boolean => micro(amount - spent) <= 0;

export type LimitCode = 'rate_limited' | 'concurrency_limited' | 'quota_exceeded' | 'budget_exceeded';

/**
 * Which limit refused, in the client's terms (docs/limits.md, "Refusals"):
 * its value, what is used of it, its period or window, and when it resets
 * (RFC 3339; null for concurrency, which frees up as requests finish).
 */
export interface LimitDetail {
  readonly kind: 'quota' | 'budget' | 'rate' | 'concurrency';
  /** A budget's route; null for the others (they are per key). */
  readonly route: string | null;
  readonly value: number;
  readonly used: number;
  readonly period: Period | null;
  /** A rate's window in seconds. */
  readonly window: number | null;
  readonly resetsAt: string | null;
}

/** Where one of a key's limits stands (GET /keyward/key): what a refusal would say, and what is left. */
export interface LimitState extends LimitDetail {
  readonly remaining: number;
  /** A rate's bucket size. */
  readonly burst?: number;
}

export interface Refused {
  readonly kind: 'refused';
  readonly code: LimitCode;
  /** Which limit refused, and where it stands (the 429's body). */
  readonly detail: LimitDetail;
  /** Whole seconds, at least 1: until a token, a slot, or the period's end. */
  readonly retryAfter: number;
  /**
   * The RateLimit-* header fields (docs/limits.md, "Refusals", after the
   * IETF draft "RateLimit header fields for HTTP"): the key's limit in
   * requests (`RateLimit-Limit`), what is left of it (`-Remaining`), seconds
   * until it is available again (`-Reset`), and its policy
   * (`RateLimit-Policy: 2;w=1;burst=3`). Null where a field does not apply:
   * a budget is no count of requests.
   */
  readonly limit: number | null;
  readonly remaining: number | null;
  readonly reset: number;
  readonly policy: string | null;
}

/**
 * Admission could not be decided in time (docs/limits.md, "Admission under
 * a store that does not answer"): the store or the primary did not answer.
 * 503; nothing forwarded, nothing consumed.
 */
export interface Undecided {
  readonly kind: 'undecided';
  readonly code: 'admission_unavailable' | 'ledger_unavailable';
  readonly retryAfter: number;
}

export interface Admission {
  readonly kind: 'admitted';
  /**
   * The request is over. `reached`: any byte of it may have reached the
   * upstream (false only when the connection was never made); `cost`: what
   * the upstream reported (null: it reported none, which counts as nothing
   * and teaches no estimate). Once, whatever calls it.
   */
  done(reached: boolean, cost: number | null): void;
  /**
   * The call's cost is known before it ends (a header at the response's
   * head): a key's first budgeted call then lets its overlapping calls go on
   * at once. Only a probe has it.
   */
  costKnown?(cost: number): void;
  /** What a budget on the request's route reserved for it (0: no budget there). */
  readonly reserved?: number;
  /**
   * A paid start's cap (docs/limits.md, "Scraper runs"): what its budget
   * reserved for it, and what the run is capped at upstream.
   */
  readonly cap?: number;
}

/** What admission decided: admitted, refused by a limit (429), or not decided in time (503). */
export type Decision = Admission | Refused | Undecided;

/**
 * Not decided yet: a lease claim, the fleet's figures, a key's first cost
 * or (in a worker) the primary's answer is awaited.
 */
export interface Pending {
  readonly kind: 'pending';
  readonly decided: Promise<Decision>;
}

/** What admission returns: a decision taken at once, or one to wait for; `kind` says which. */
export type Verdict = Decision | Pending;

export const pending = (decided: Promise<Decision>): Pending => ({ kind: 'pending', decided });

/** The decision, as a promise when it is still pending. */
export const decided = (v: Verdict): Decision | Promise<Decision> => (v.kind === 'pending' ? v.decided : v);

/** `f` once the decision is taken: at once when it was, else when it is. */
export function whenDecided(v: Verdict, f: (d: Decision) => void): void {
  if (v.kind !== 'pending') return f(v);
  detach(v.decided.then(f), neverRejects);
}

/** The verdict with `f` applied to its decision, whenever that is taken. */
export const mapDecision = (v: Verdict, f: (d: Decision) => Decision): Verdict => (v.kind === 'pending' ? pending(v.decided.then(f)) : f(v));

/**
 * A call that starts paid work billed after the fact (a scraper run): what
 * the client asked its cap to be, if it sent one plain value.
 */
export interface PaidStart {
  readonly asked: number | null;
}

/**
 * A run's cap (docs/limits.md, "Scraper runs"): the smallest of what is
 * left, the key's per-run cap and the client's own value; with neither of
 * those, a tenth of the budget. Rounded down to the micro-dollar.
 */
export function runCapOf(left: number, amount: number, keyCap: number | null, asked: number | null): number {
  const want = asked ?? keyCap ?? amount / 10;
  return floorMicro(Math.max(0, Math.min(left, want, keyCap ?? Infinity)));
}

/** What the ledger knows of a period: requests forwarded for a key, cost reported for a key on a route. */
/** A budget as a policy holds it. */
type Budget = { readonly amount: number; readonly period: Period };

export interface PeriodUse {
  requests(keyId: string, period: Period, now: number): number;
  cost(keyId: string, route: string, period: Period, now: number): number;
}

const NOTHING: Admission = { kind: 'admitted', done: () => undefined };
const seconds = (ms: number): number => Math.max(1, Math.ceil(ms / 1000));
/**
 * The longest a key's calls on a budgeted route wait for its first call's
 * cost (docs/limits.md, "Reserved at admission"); then they go on at the
 * route's estimate, if any was learnt meanwhile, else at none.
 */
export const PROBE_MS = 2_000;
/**
 * The longest a call waits for its key's earlier calls' cost, over every
 * probe it waits behind; then it is answered 503 (nothing forwarded,
 * nothing consumed). Below a worker's wait for its primary (admissions.ts),
 * so a late cost is never taken for a silent primary.
 */
export const PROBE_WAIT_MS = 2 * PROBE_MS;
/** Not decided in time: a store or the primary did not answer, or a key's cost stayed unknown. */
const UNDECIDED: Undecided = { kind: 'undecided', code: 'admission_unavailable', retryAfter: 1 };
/** The ledger's store did not answer within the admission wait. */
const LEDGER_SILENT: Undecided = { kind: 'undecided', code: 'ledger_unavailable', retryAfter: 1 };
const CLAIMED = Symbol('claimed');

/** A key's allowance on one route: the composite every per-key, per-route map is keyed by. */
export type KeyRoute = string & { readonly __keyRoute: true };
export const keyRoute = (keyId: string, route: string): KeyRoute => `${keyId}\u0000${route}` as KeyRoute;

/**
 * The key's figures across a fleet (read from the store's view of the
 * ledger): `cached` as last read, never waiting (what a refusal the leases
 * decided gives); `fresh` read afresh for a billed-later route's run, whose cap
 * is what is left of the fleet's budget.
 */
export interface FleetFigures {
  cached(keyId: string, now: number): PeriodUse | null;
  fresh(keyId: string, now: number): Promise<unknown>;
}

/** What a limiter decides with, beside the ledger's period totals. */
export interface LimiterDeps {
  /** Quotas and budgets by leases (a fleet's in PostgreSQL, one machine's in its SQLite file); absent: the period totals alone (counting in memory). */
  readonly leases?: Allowances | null;
  /** Each route's cost per call, shared with the leases (default: one of its own). */
  readonly costs?: RouteCosts;
  /** Routes billed later (the scraper's runs, settled after the fact): a paid start reserves its cap, nothing else reserves or teaches. */
  readonly billedLater?: ReadonlySet<string>;
  /** The longest an admission waits for the store (a lease claim, a run's fresh figures), ms. */
  readonly waitMs?: number;
  /** In a fleet: the key's figures across it. */
  readonly fleet?: FleetFigures | null;
}

export class Limiter {
  readonly #use: PeriodUse;
  readonly #leases: Allowances | null;
  readonly #costs: RouteCosts;
  readonly #fleet: FleetFigures | null;
  readonly #buckets = new Map<string, { tokens: number; at: number }>();
  /** Requests in flight, by key (concurrency). */
  readonly #inFlight = new Map<string, number>();
  /** Where quota units and budgets are taken from: the leases, else what requests in flight hold. */
  readonly #allowances: Allowances;
  /** What a call costs, learnt per key and route (per route in `#costs`, for a key's first calls). */
  readonly #estimates = new Map<KeyRoute, number>();
  /** By key and route: the key's first call with a budget, while its cost is not known yet. */
  readonly #probes = new Map<KeyRoute, Promise<void>>();

  readonly #billedLater: ReadonlySet<string>;
  readonly #waitMs: number;

  constructor(use: PeriodUse, deps: LimiterDeps = {}) {
    this.#use = use;
    this.#leases = deps.leases ?? null;
    this.#allowances = this.#leases ?? new InFlight();
    this.#costs = deps.costs ?? new RouteCosts();
    this.#billedLater = deps.billedLater ?? new Set();
    this.#waitMs = deps.waitMs ?? Infinity;
    this.#fleet = deps.fleet ?? null;
  }

  /** The estimate a budget reserves for the next call of `keyId` on `route`: its recent cost per call, else the route's, never below the route's dearest call this period. */
  estimate(keyId: string, route: string, period: Period = 'day', now = Date.now()): number {
    const learnt = this.#estimates.get(keyRoute(keyId, route)) ?? this.#costs.perCall(route) ?? 0;
    return Math.max(learnt, this.#costs.floor(route, period, now));
  }

  /**
   * `share`: the live gateways of a fleet (1 alone). Each takes 1/share of a
   * key's rate and burst, and of its concurrency rounded up, so the fleet
   * together admits at most the limit plus share-1 (docs/limits.md). In a
   * fleet, quotas and budgets are taken from leases: a promise when this
   * gateway must first claim more. `start`: the request starts paid work
   * billed after the fact (a scraper run), capped and reserved at its cap.
   */
  admit(keyId: string, policy: Policy, route: string, now: number, share = 1, start: PaidStart | null = null): Verdict {
    return this.#probeFirst(keyId, policy, route, now, share, start, now);
  }

  /** `since`: when this call began to wait for its key's first call's cost. */
  #probeFirst(keyId: string, policy: Policy, route: string, now: number, share: number, start: PaidStart | null, since: number): Verdict {
    // A run on a billed-later route in a fleet is capped at what is left of the
    // fleet's budget: read for it by a query that starts with it (bounded by
    // the store's deadline), as a lease claim would be. Runs are started
    // seconds apart; no other request waits for this.
    if (start !== null && this.#fleet !== null && this.#leases !== null && this.#billedLater.has(route) && policy.budgets.has(route)) {
      // Not read in time: the lease alone decides (its caps are exact; the figures only refuse sooner).
      const decide = (): Decision | Promise<Decision> => decided(this.#decide(keyId, policy, route, Date.now(), share, start));
      return pending(within(this.#fleet.fresh(keyId, now), this.#waitMs, undefined).then(decide, decide));
    }
    // A budget on a route whose cost was never seen here has nothing to
    // reserve: the key's first call goes alone, and that key's calls that
    // overlap it wait for its cost (else all of them would pass at an
    // estimate of 0). Other keys never wait for it, and nobody waits longer
    // than PROBE_MS: a stream that keeps moving has no end to wait for.
    // No closure on the common path: it runs for every request of a key with limits.
    if (!policy.budgets.has(route) || this.#known(keyId, route)) return this.#decide(keyId, policy, route, now, share, start);
    const slot = keyRoute(keyId, route);
    const waiting = this.#probes.get(slot);
    if (waiting !== undefined) {
      if (now - since >= PROBE_WAIT_MS) return UNDECIDED;
      return pending(waiting.then(() => decided(this.#probeFirst(keyId, policy, route, Date.now(), share, start, since))));
    }
    // This call is the probe: the key's calls on the route that come while it runs wait for it.
    let over: () => void = () => undefined;
    const probe = new Promise<void>((resolve) => (over = resolve));
    this.#probes.set(slot, probe);
    const release = (): void => {
      clearTimeout(timer);
      if (this.#probes.get(slot) === probe) this.#probes.delete(slot);
      over();
    };
    const timer = setTimeout(release, PROBE_MS);
    timer.unref();
    const wrap = (r: Decision): Decision => {
      if (r.kind !== 'admitted') {
        release();
        return r;
      }
      // The admission as it was (its reservation and cap kept), with the probe's end added to it.
      const done: Admission['done'] = (reached, cost) => {
        r.done(reached, cost);
        release();
      };
      const costKnown = (cost: number): void => {
        // Learnt now, so the calls that waited reserve it; the call itself is reconciled at its end.
        if (!Number.isFinite(cost) || this.#known(keyId, route)) return release();
        this.#learn(keyId, route, cost);
        release();
      };
      return { ...withDone(r, done), costKnown };
    };
    return mapDecision(this.#decide(keyId, policy, route, now, share, start), wrap);
  }

  #decide(keyId: string, policy: Policy, route: string, now: number, share: number, start: PaidStart | null): Verdict {
    // Neither a quota nor a budget on the route: nothing is taken from an allowance.
    if (policy.quota === null && !policy.budgets.has(route)) {
      const limit = this.#rateAndSlot(keyId, policy, now, share);
      if (typeof limit !== 'number') return limit;
      return limit === 0 ? NOTHING : this.#admitted(keyId, route, true, false, null, 0, () => undefined);
    }
    return this.#take(this.#allowances, keyId, policy, route, now, share, start, 0);
  }

  /** The key's requests across the fleet as last read (what GET /keyward/key shows), for a refusal the leases decided; this gateway's own when none was read. */
  #fleetRequests(keyId: string, period: Period, now: number): number {
    return (this.#fleet?.cached(keyId, now) ?? this.#use).requests(keyId, period, now);
  }

  #fleetCost(keyId: string, route: string, period: Period, now: number): number {
    return (this.#fleet?.cached(keyId, now) ?? this.#use).cost(keyId, route, period, now);
  }

  #known(keyId: string, route: string): boolean {
    // A billed-later route's cost is never in its response: nothing to wait for, a paid start reserves its cap.
    return this.#costs.has(route) || this.#estimates.has(keyRoute(keyId, route)) || this.#billedLater.has(route);
  }

  /**
   * What a budget reserves for this call: on a billed-later route a paid start's
   * cap (null: less than a micro-unit is left, refused) and nothing for any
   * other call; elsewhere the estimate.
   */
  #reserve(keyId: string, policy: Policy, route: string, budget: Budget, left: number, start: PaidStart | null, now: number): number | null {
    if (!this.#billedLater.has(route)) return this.estimate(keyId, route, budget.period, now);
    if (start === null) return 0;
    const cap = runCapOf(left, budget.amount, policy.runCap, start.asked);
    return cap > 0 ? cap : null;
  }

  /** The quota is all taken: the key's figure is what the fleet counted (as last read), at least the quota. */
  #quotaRefused(al: Allowances, keyId: string, quota: { readonly count: number; readonly period: Period }, q: string, at: number): Refused {
    const used = Math.max(quota.count, this.#fleetRequests(keyId, quota.period, at) + al.reserved(keyId, QUOTA, q));
    return periodOver('quota_exceeded', quota.count, quota.period, at, used, null);
  }

  /** The budget on `route` is all taken: what the fleet spent (as last read), at least the budget. */
  #budgetRefused(al: Allowances, keyId: string, route: string, kind: string, budget: Budget, b: string, at: number): Refused {
    const spent = Math.max(budget.amount, this.#fleetCost(keyId, route, budget.period, at) + al.reserved(keyId, kind, b));
    return periodOver('budget_exceeded', budget.amount, budget.period, at, spent, route);
  }

  /**
   * The one check of a quota and a budget: what the ledger already counts,
   * plus what requests in flight here took. Past the limit, refused with
   * those figures before anything is taken. Otherwise what is left of the
   * route's budget by the fleet's figures (null without a budget).
   */
  #check(al: Allowances, keyId: string, policy: Policy, route: string, at: number, q: string, b: string): Refused | number | null {
    const quota = policy.quota;
    const budget = policy.budgets.get(route);
    if (quota !== null) {
      const used = this.#use.requests(keyId, quota.period, at) + al.reserved(keyId, QUOTA, q);
      if (used >= quota.count) return periodOver('quota_exceeded', quota.count, quota.period, at, used, null);
    }
    if (budget === undefined) return null;
    const reserved = al.reserved(keyId, budgetKind(route), b);
    const spent = this.#use.cost(keyId, route, budget.period, at) + reserved;
    if (budgetSpent(budget.amount, spent)) return periodOver('budget_exceeded', budget.amount, budget.period, at, spent, route);
    // The fleet's figure as last read, when larger than what this gateway counted itself (one gateway: its own).
    const fleetSpent = this.#fleet === null ? spent : Math.max(spent, this.#fleetCost(keyId, route, budget.period, at) + reserved);
    // A billed-later route's figures were read for this admission: spent by
    // them, it is refused, whatever this gateway's lease still holds (a
    // run settled below its reservation gives units back to the
    // allowance, and a lease claimed before may hold them).
    if (budgetSpent(budget.amount, fleetSpent) && this.#billedLater.has(route))
      return periodOver('budget_exceeded', budget.amount, budget.period, at, fleetSpent, route);
    return budget.amount - fleetSpent;
  }

  /**
   * Quota and budget checked once and taken from the allowances (leases,
   * or what requests in flight hold), then rate and concurrency as this
   * gateway's share. `attempt`: claims already waited for.
   */
  #take(al: Allowances, keyId: string, policy: Policy, route: string, now: number, share: number, start: PaidStart | null, attempt: number): Verdict {
    const quota = policy.quota;
    const budget = policy.budgets.get(route);
    const at = al.at(now);
    const q = quota === null ? '' : al.periodKey(quota.period, at);
    const b = budget === undefined ? '' : al.periodKey(budget.period, at);
    const kind = budgetKind(route);
    const before = this.#check(al, keyId, policy, route, at, q, b);
    if (typeof before !== 'number' && before !== null) return before;
    const reserve = budget === undefined ? 0 : this.#reserve(keyId, policy, route, budget, before ?? 0, start, now);
    if (reserve === null && budget !== undefined) return this.#budgetRefused(al, keyId, route, kind, budget, b, at);
    // A refusal, or asking again once a claim is answered (`#notTaken`), is
    // built only when one is due (bench/README.md, "Admission"): a take
    // changes nothing a refusal reads unless it takes.
    if (quota !== null) {
      const took = al.take(keyId, QUOTA, q, quota.count, 1);
      if (took.kind !== 'taken')
        return this.#notTaken(
          took,
          attempt,
          () => this.#take(al, keyId, policy, route, Date.now(), share, start, attempt + 1),
          () => this.#quotaRefused(al, keyId, quota, q, at),
        );
    }
    let estimate = reserve ?? 0;
    // A paid start's cap is what the allowance can still hold of it, never
    // more; any other call on a budgeted route takes its estimate, and a
    // billed-later route's other calls take nothing.
    if (budget !== undefined && (estimate > 0 || !this.#billedLater.has(route))) {
      const took = this.#billedLater.has(route) ? al.takeUpTo(keyId, kind, b, budget.amount, estimate) : al.take(keyId, kind, b, budget.amount, estimate);
      if (took.kind !== 'taken') {
        if (quota !== null) al.reconcile(keyId, QUOTA, q, 1, 0);
        return this.#notTaken(
          took,
          attempt,
          () => this.#take(al, keyId, policy, route, Date.now(), share, start, attempt + 1),
          () => this.#budgetRefused(al, keyId, route, kind, budget, b, at),
        );
      }
      estimate = took.amount;
    }
    const limit = this.#rateAndSlot(keyId, policy, now, share);
    if (typeof limit !== 'number') {
      if (quota !== null) al.reconcile(keyId, QUOTA, q, 1, 0);
      if (budget !== undefined) al.reconcile(keyId, kind, b, estimate, 0);
      return limit;
    }
    return this.#admitted(keyId, route, limit > 0, budget !== undefined, start, estimate, (reached, cost) => {
      if (quota !== null) al.reconcile(keyId, QUOTA, q, 1, reached ? 1 : 0);
      if (budget !== undefined) al.reconcile(keyId, kind, b, estimate, reached ? (cost ?? 0) : 0);
    });
  }

  /**
   * A take that did not take: refused when the allowance is spent; 503 when
   * its store did not answer the last claim, or does not answer this one
   * within the admission wait (nothing consumed: the claim goes on, and
   * what it gets stays in the lease); otherwise asked again once the claim
   * is answered. Each claim either gets something or marks the lease spent,
   * so this ends; past 50 claims (others took what each one got) it is 503
   * too, never a 429 for a limit nobody showed spent.
   */
  #notTaken(took: Took, attempt: number, again: () => Verdict, refused: () => Refused): Verdict {
    if (took.kind === 'spent') return refused();
    if (took.kind !== 'claiming' || attempt >= 50) return took.kind === 'unreachable' ? LEDGER_SILENT : UNDECIDED;
    return pending(
      within(
        took.claimed.then(() => CLAIMED),
        this.#waitMs,
        LEDGER_SILENT,
      ).then((r) => (r === LEDGER_SILENT ? LEDGER_SILENT : decided(again()))),
    );
  }

  /** An admission: once, its slot back (when it took one), `reconcile` for what the period's limits reserved, a reported cost learnt. */
  #admitted(
    keyId: string,
    route: string,
    slot: boolean,
    budget: boolean,
    start: PaidStart | null,
    reserved: number,
    reconcile: (reached: boolean, cost: number | null) => void,
  ): Admission {
    let over = false;
    const done = (reached: boolean, cost: number | null): void => {
      if (over) return;
      over = true;
      if (slot) drop(this.#inFlight, keyId, 1);
      reconcile(reached, cost);
      // Only a cost the upstream reported teaches; a billed-later route's calls teach nothing.
      if (budget && reached && cost !== null && !this.#billedLater.has(route)) this.#learn(keyId, route, cost);
    };
    // A paid start carries its cap; other admissions only `done` (and what they reserved).
    return start !== null && budget && this.#billedLater.has(route)
      ? { kind: 'admitted', done, cap: reserved, reserved }
      : budget
        ? { kind: 'admitted', done, reserved }
        : { kind: 'admitted', done };
  }

  /** Concurrency and rate, this gateway's share: a refusal, or the concurrency limit whose slot was taken (0: none). */
  #rateAndSlot(keyId: string, policy: Policy, now: number, share: number): Refused | number {
    const limit = policy.concurrency === null ? null : Math.max(1, Math.ceil(policy.concurrency / share));
    const running = this.#inFlight.get(keyId) ?? 0;
    // The key's concurrency, not this gateway's share of it: the client's view. No time window, so no policy.
    if (limit !== null && running >= limit) {
      // In a fleet this gateway holds ⌈c/N⌉ of the key's c: full here, the key's figure is all of it in use.
      const detail: LimitDetail = {
        kind: 'concurrency',
        route: null,
        value: policy.concurrency as number,
        used: Math.max(running, policy.concurrency as number),
        period: null,
        window: null,
        resetsAt: null,
      };
      return { kind: 'refused', code: 'concurrency_limited', detail, retryAfter: 1, limit: policy.concurrency, remaining: 0, reset: 1, policy: null };
    }
    if (policy.rate !== null) {
      const { count, seconds: per } = policy.rate;
      const burst = Math.max(1, policy.rate.burst / share);
      const perMs = count / share / (per * 1000);
      const bucket = this.#buckets.get(keyId) ?? { tokens: burst, at: now };
      bucket.tokens = Math.min(burst, bucket.tokens + (now - bucket.at) * perMs);
      bucket.at = now;
      this.#buckets.set(keyId, bucket);
      if (bucket.tokens < 1) {
        const wait = seconds((1 - bucket.tokens) / perMs);
        // The key's rate per its window, its burst as the draft's `burst` parameter (not this gateway's share).
        const detail: LimitDetail = { kind: 'rate', route: null, value: count, used: count, period: null, window: per, resetsAt: resetAt(now + wait * 1000) };
        return {
          kind: 'refused',
          code: 'rate_limited',
          detail,
          retryAfter: wait,
          limit: count,
          remaining: 0,
          reset: wait,
          policy: `${count};w=${per};burst=${policy.rate.burst}`,
        };
      }
      bucket.tokens -= 1;
    }
    if (limit === null) return 0;
    this.#inFlight.set(keyId, running + 1);
    return limit;
  }

  /**
   * Where each of a key's limits stands at `now`, taking nothing: quota and
   * budgets as counted plus what requests in flight reserved (the figures a
   * refusal gives), a rate's bucket as it would be refilled, the requests in
   * flight. `use`: the period totals to read (a fleet's, read from its
   * ledger); default this limiter's own.
   */
  status(keyId: string, policy: Policy, now: number, share = 1, use: PeriodUse = this.#use): LimitState[] {
    const out: LimitState[] = [];
    const al = this.#allowances;
    const q = policy.quota;
    if (q !== null) {
      const used = use.requests(keyId, q.period, now) + al.reserved(keyId, QUOTA, al.periodKey(q.period, al.at(now)));
      out.push({
        kind: 'quota',
        route: null,
        value: q.count,
        used,
        remaining: Math.max(0, q.count - used),
        period: q.period,
        window: null,
        resetsAt: resetAt(periodOf(q.period, now).ends),
      });
    }
    for (const [route, b] of policy.budgets) {
      const spent = use.cost(keyId, route, b.period, now) + al.reserved(keyId, budgetKind(route), al.periodKey(b.period, al.at(now)));
      const used = micro(spent);
      out.push({
        kind: 'budget',
        route,
        value: b.amount,
        used,
        remaining: Math.max(0, micro(b.amount - spent)),
        period: b.period,
        window: null,
        resetsAt: resetAt(periodOf(b.period, now).ends),
      });
    }
    if (policy.rate !== null) {
      const { count, seconds: per, burst } = policy.rate;
      // This gateway's bucket holds its share; the key's figures are the share times the gateways.
      const perMs = count / (per * 1000);
      const bucket = this.#buckets.get(keyId);
      const tokens = bucket === undefined ? burst : Math.min(burst, (bucket.tokens + (now - bucket.at) * (perMs / share)) * share);
      const remaining = Math.max(0, Math.floor(tokens + 1e-9));
      out.push({
        kind: 'rate',
        route: null,
        value: count,
        burst,
        used: burst - remaining,
        remaining,
        period: null,
        window: per,
        resetsAt: resetAt(now + (burst - tokens) / perMs),
      });
    }
    if (policy.concurrency !== null) {
      const used = this.#inFlight.get(keyId) ?? 0;
      out.push({
        kind: 'concurrency',
        route: null,
        value: policy.concurrency,
        used,
        remaining: Math.max(0, policy.concurrency - used),
        period: null,
        window: null,
        resetsAt: null,
      });
    }
    return out;
  }

  #learn(keyId: string, route: string, cost: number): void {
    if (!Number.isFinite(cost) || cost < 0) return;
    learn(this.#estimates, keyRoute(keyId, route), cost);
    this.#costs.learn(route, cost, Date.now());
  }
}

/** `a` with another `done` (a wrapper's), its budget figures kept: one shape per kind, no spread on the request path. */
export function withDone(a: Admission, done: Admission['done']): Admission {
  if (a.cap !== undefined) return { kind: 'admitted', done, cap: a.cap, reserved: a.reserved ?? a.cap };
  return a.reserved === undefined ? { kind: 'admitted', done } : { kind: 'admitted', done, reserved: a.reserved };
}

/** When a period ends, as RFC 3339 in UTC rounded up to the second (a reset time a client can wait for). */
const resetAt = (ms: number): string => rfc3339(Math.ceil(ms / 1000) * 1000);

function periodOver(code: LimitCode, limit: number, period: Period, now: number, used: number, route: string | null): Refused {
  const { starts, ends } = periodOf(period, now);
  const wait = seconds(ends - now);
  const detail: LimitDetail = {
    kind: code === 'budget_exceeded' ? 'budget' : 'quota',
    route,
    value: limit,
    // To the micro-unit, as GET /keyward/key gives it: a sum of decimal costs is off in its last bits.
    used: micro(used),
    period,
    window: null,
    resetsAt: resetAt(ends),
  };
  // A quota counts requests over the period (its window in seconds); a budget counts money or characters.
  if (code === 'budget_exceeded') return { kind: 'refused', code, detail, retryAfter: wait, limit: null, remaining: null, reset: wait, policy: null };
  return { kind: 'refused', code, detail, retryAfter: wait, limit, remaining: 0, reset: wait, policy: `${limit};w=${Math.round((ends - starts) / 1000)}` };
}

/** Take `n` from `map`'s entry for `k`, removing it at zero (floating-point dust included). */
function drop(map: Map<string, number>, k: string, n: number): void {
  const left = (map.get(k) ?? n) - n;
  if (left <= 1e-9) map.delete(k);
  else map.set(k, left);
}
