// Admission against a key's limits (docs/limits.md): an admission or the
// refusal to answer with (429). Nothing is consumed by a refused request: the
// checks run first, then the admission takes its token and its slot. The slot
// comes back through `release`, called once the response is finished or the
// client left, whichever comes first.
import { periodOf, type Period, type Policy } from './policy.ts';

export type LimitCode = 'rate_limited' | 'concurrency_limited' | 'quota_exceeded' | 'budget_exceeded';

export interface Refused {
  readonly code: LimitCode;
  /** Whole seconds, at least 1: until a token, a slot, or the period's end. */
  readonly retryAfter: number;
  /** For the RateLimit-* headers: the limit refused on, what is left of it (0), and when it resets, s. */
  readonly limit: number;
  readonly remaining: number;
  readonly reset: number;
}

export interface Admission {
  /** Give back the concurrency slot; once, whatever calls it. */
  release(): void;
}

/** What the ledger knows of a period: requests forwarded for a key, cost reported for a key on a route. */
export interface PeriodUse {
  requests(keyId: string, period: Period, now: number): number;
  cost(keyId: string, route: string, period: Period, now: number): number;
}

const NOTHING: Admission = { release: () => undefined };
const seconds = (ms: number): number => Math.max(1, Math.ceil(ms / 1000));

export class Limiter {
  readonly #use: PeriodUse;
  readonly #buckets = new Map<string, { tokens: number; at: number }>();
  readonly #inFlight = new Map<string, number>();

  constructor(use: PeriodUse) {
    this.#use = use;
  }

  /**
   * `share`: the live gateways of a fleet (1 alone). Each takes 1/share of a
   * key's rate and burst, and of its concurrency rounded up, so the fleet
   * together admits at most the limit plus share-1 (docs/limits.md).
   */
  admit(keyId: string, policy: Policy, route: string, now: number, share = 1): Admission | Refused {
    if (policy.quota !== null) {
      const used = this.#use.requests(keyId, policy.quota.period, now);
      if (used >= policy.quota.count) return this.#periodOver('quota_exceeded', policy.quota.count, policy.quota.period, now);
    }
    const budget = policy.budgets.get(route);
    if (budget !== undefined && this.#use.cost(keyId, route, budget.period, now) >= budget.amount) {
      return this.#periodOver('budget_exceeded', budget.amount, budget.period, now);
    }
    const limit = policy.concurrency === null ? null : Math.max(1, Math.ceil(policy.concurrency / share));
    const running = this.#inFlight.get(keyId) ?? 0;
    if (limit !== null && running >= limit) return { code: 'concurrency_limited', retryAfter: 1, limit, remaining: 0, reset: 1 };
    let bucket: { tokens: number; at: number } | undefined;
    if (policy.rate !== null) {
      const { count, seconds: per } = policy.rate;
      const burst = Math.max(1, policy.rate.burst / share);
      const perMs = count / share / (per * 1000);
      bucket = this.#buckets.get(keyId) ?? { tokens: burst, at: now };
      bucket.tokens = Math.min(burst, bucket.tokens + (now - bucket.at) * perMs);
      bucket.at = now;
      this.#buckets.set(keyId, bucket);
      if (bucket.tokens < 1) {
        const wait = seconds((1 - bucket.tokens) / perMs);
        return { code: 'rate_limited', retryAfter: wait, limit: burst, remaining: 0, reset: wait };
      }
      bucket.tokens -= 1;
    }
    if (limit === null) return NOTHING;
    this.#inFlight.set(keyId, running + 1);
    let released = false;
    return {
      release: () => {
        if (released) return;
        released = true;
        const n = (this.#inFlight.get(keyId) ?? 1) - 1;
        if (n <= 0) this.#inFlight.delete(keyId);
        else this.#inFlight.set(keyId, n);
      },
    };
  }

  #periodOver(code: LimitCode, limit: number, period: Period, now: number): Refused {
    const wait = seconds(periodOf(period, now).ends - now);
    return { code, retryAfter: wait, limit, remaining: 0, reset: wait };
  }
}
