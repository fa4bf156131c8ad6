// Alerts before a quota or budget runs out (docs/limits.md, "Alerts"). Each
// threshold of each limit fires once per period: the store records a firing
// with a unique row (key, limit, period, threshold), and only the process
// whose insert made the row fires it. So a restart, a second gateway or
// usage hovering at the line never fires it again. Checks run after a key's
// counts changed, off the request path: a request never waits for one.
import type { PeriodUse } from '../limits/limiter.ts';
import { periodOf, type Period, type Policy } from '../limits/policy.ts';
import type { AlertStore } from '../ledger/store.ts';
import { backoff } from '../lib/backoff.ts';
import { micro, rfc3339 } from '../lib/format.ts';
import { UNWATCHED, type Watch } from '../observe/outages.ts';

export interface Alert {
  readonly id: string;
  readonly event: 'threshold_crossed' | 'limit_reached';
  readonly key: { readonly id: string; readonly name: string };
  readonly limit: {
    readonly kind: 'quota' | 'budget';
    readonly route?: string;
    readonly value: number;
    readonly unit: string;
    readonly period: Period;
    /** The period's key (`2026-11-24`, `2026-11`). */
    readonly periodKey: string;
    readonly threshold: number;
    readonly resetsAt: string;
  };
  readonly used: number;
  readonly at: string;
}

/** The limits of `policy` crossed at `now` for `threshold`s not fired before: pure. */
export function crossed(key: { id: string; name: string }, policy: Policy, use: PeriodUse, now: number, unitOf: (route: string) => string): Alert[] {
  const out: Alert[] = [];
  const at = new Date(now).toISOString();
  const check = (kind: 'quota' | 'budget', route: string | null, value: number, period: Period, used: number): void => {
    const p = periodOf(period, now);
    for (const threshold of policy.alerts) {
      if (used * 100 < threshold * value - 1e-9) break;
      const limit = {
        kind,
        ...(route === null ? {} : { route }),
        value,
        unit: route === null ? 'requests' : unitOf(route),
        period,
        periodKey: p.key,
        threshold,
        resetsAt: rfc3339(p.ends),
      };
      out.push({
        id: `${key.id}/${kind}${route === null ? '' : `:${route}`}/${p.key}/${threshold}`,
        event: threshold >= 100 ? 'limit_reached' : 'threshold_crossed',
        key: { id: key.id, name: key.name },
        limit,
        used: micro(used),
        at,
      });
    }
  };
  if (policy.quota !== null) check('quota', null, policy.quota.count, policy.quota.period, use.requests(key.id, policy.quota.period, now));
  for (const [route, b] of policy.budgets) check('budget', route, b.amount, b.period, use.cost(key.id, route, b.period, now));
  return out;
}

/** Flush intervals a fleet's key is checked for after its last request here. */
const AFTER_LAST = 4;
/**
 * When the store could not be read or a firing not recorded, the key is
 * checked again this long after: a SQLite ledger fails at once while another
 * process holds its write lock (a worker's flush), and a key at 100 % may
 * never make another request that would bring it back.
 */
const RETRY_MS = 250;
/** Retries back off to this (a store that stays down is not asked for every key four times a second). */
const RETRY_MAX_MS = 30_000;

export class Alerts {
  readonly #store: AlertStore;
  readonly #use: (keyId: string, now: number) => PeriodUse | Promise<PeriodUse>;
  readonly #fire: (alert: Alert, body: string) => void;
  readonly #unitOf: (route: string) => string;
  readonly #now: () => number;
  /** Firings known here (claimed here, or found claimed): never asked of the store again. */
  readonly #seen = new Set<string>();
  /** Keys to check, and until when (a fleet's keep being checked for a few flushes after their last request). */
  readonly #dirty = new Map<string, { key: { id: string; name: string }; policy: Policy; until: number }>();
  #scheduled: { cancel(): void } | null = null;
  /** 0: check as soon as the event loop is free; else every `everyMs` (a fleet's, whose totals come from the store). */
  readonly #everyMs: number;
  #checking: Promise<void> = Promise.resolve();
  /** Checks in a row that met a store failure. */
  #failures = 0;
  #stopped = false;
  readonly #onDeferred: () => void;
  /** Keys taken out of the queue by the check under way. */
  #inCheck = 0;
  readonly #watch: Watch;

  constructor(options: {
    store: AlertStore;
    use: (keyId: string, now: number) => PeriodUse | Promise<PeriodUse>;
    fire: (alert: Alert, body: string) => void;
    unitOf: (route: string) => string;
    now?: () => number;
    everyMs?: number;
    /** A check could not read a key's figures or record a firing (the store locked or unreachable): it is checked again. */
    onDeferred?: () => void;
    /** Checks that keep failing are seen (observe/outages.ts). */
    watch?: Watch;
  }) {
    this.#watch = options.watch ?? UNWATCHED;
    this.#store = options.store;
    this.#use = options.use;
    this.#fire = options.fire;
    this.#unitOf = options.unitOf;
    this.#now = options.now ?? Date.now;
    this.#everyMs = options.everyMs ?? 0;
    this.#onDeferred = options.onDeferred ?? (() => undefined);
  }

  /** Keys whose thresholds are still to be checked (0: nothing more can fire until a request is counted). */
  get pending(): number {
    return this.#dirty.size + this.#inCheck;
  }

  /** A request of this key was counted: its thresholds are checked soon. */
  touched(key: { id: string; name: string }, policy: Policy): void {
    if (policy.alerts.length === 0) return;
    // In a fleet the request that crossed a line may be another gateway's,
    // written at its next flush: the key is checked again for a few flush
    // intervals after its last request here, so the crossing is seen once
    // every gateway has written what it counted.
    this.#dirty.set(key.id, { key, policy, until: this.#now() + AFTER_LAST * this.#everyMs });
    this.#schedule();
  }

  /** The next check: as soon as the event loop is free, or after `afterMs` (a fleet's interval, a retry). */
  #schedule(afterMs = this.#everyMs): void {
    if (this.#stopped || this.#scheduled !== null || this.#dirty.size === 0) return;
    const run = (): void => {
      this.#scheduled = null;
      // A check that throws is a bug (store failures are caught per key): seen, and the queue goes on.
      this.#checking = this.#checking.then(() => this.#check()).catch((err: unknown) => this.#watch.failed(err));
    };
    if (afterMs === 0) {
      const i = setImmediate(run).unref();
      this.#scheduled = { cancel: () => clearImmediate(i) };
    } else {
      const t = setTimeout(run, afterMs).unref();
      this.#scheduled = { cancel: () => clearTimeout(t) };
    }
  }

  stop(): void {
    this.#stopped = true;
    this.#scheduled?.cancel();
    this.#scheduled = null;
  }

  async #check(): Promise<void> {
    const dirty = [...this.#dirty.values()];
    this.#dirty.clear();
    this.#inCheck = dirty.length;
    try {
      await this.#checkAll(dirty);
    } finally {
      this.#inCheck = 0;
    }
  }

  async #checkAll(dirty: Array<{ key: { id: string; name: string }; policy: Policy; until: number }>): Promise<void> {
    const again = (d: (typeof dirty)[number]): void => {
      if (d.until > this.#now() && !this.#dirty.has(d.key.id)) this.#dirty.set(d.key.id, d);
    };
    let failed = false;
    let why: unknown = null;
    const retry = (d: (typeof dirty)[number], err: unknown): void => {
      if (!failed) why = err;
      failed = true;
      if (!this.#dirty.has(d.key.id)) this.#dirty.set(d.key.id, d);
    };
    for (const d of dirty) {
      const { key, policy } = d;
      again(d);
      const now = this.#now();
      let use: PeriodUse;
      try {
        use = await this.#use(key.id, now);
      } catch (err) {
        // The store could not be read: checked again shortly.
        retry(d, err);
        continue;
      }
      for (const alert of crossed(key, policy, use, now, this.#unitOf)) {
        if (this.#seen.has(alert.id)) continue;
        if (this.#seen.size >= 100_000) this.#seen.clear();
        this.#seen.add(alert.id);
        const body = JSON.stringify({ event: alert.event, key: alert.key, limit: alert.limit, used: alert.used, at: alert.at, id: alert.id });
        let mine: boolean;
        try {
          mine = await this.#store.claimAlert({ id: alert.id, keyId: key.id, body, at: now });
        } catch (err) {
          // Not recorded (the store locked or unreachable): asked again shortly.
          this.#seen.delete(alert.id);
          retry(d, err);
          continue;
        }
        if (mine) this.#fire(alert, body);
      }
    }
    this.#failures = failed ? this.#failures + 1 : 0;
    if (failed) this.#onDeferred();
    // A SQLite ledger locked by a worker's flush fails a check now and then,
    // and its retry 250 ms later passes: an outage is three checks in a row.
    if (this.#failures >= 3) this.#watch.failed(why);
    else if (!failed) this.#watch.ok();
    this.#schedule(failed ? Math.max(this.#everyMs, backoff(this.#failures, { firstMs: RETRY_MS, maxMs: RETRY_MAX_MS })) : this.#everyMs);
  }
}
