// A key's limits (docs/limits.md): as stored on the key record, as written
// on the command line, and parsed once into the numbers admission reads.
// Pure.

/** Limits as stored on a key record (keys file, PostgreSQL): readable strings, parsed when the key set is built. */
export interface Limits {
  /** `N/s`, `N/m` or `N/h`: a token bucket refilled at that rate. */
  readonly rate?: string;
  /** Bucket size; default the rate's N. */
  readonly burst?: number;
  /** Requests of the key in flight at once. */
  readonly concurrency?: number;
  /** `N/day` or `N/month`: requests forwarded per UTC calendar period. */
  readonly quota?: string;
  /** Route → `AMOUNT/day` or `AMOUNT/month`, in the cost unit the route's upstream reports. */
  readonly budgets?: Readonly<Record<string, string>>;
  /**
   * Percentages of a quota or budget at which an alert fires (`--alert-at`,
   * docs/limits.md "Alerts"); absent: 80 and 100; empty: none.
   */
  readonly alerts?: readonly number[];
}

export type Period = 'day' | 'month';

export interface Policy {
  readonly rate: { readonly count: number; readonly seconds: number; readonly burst: number } | null;
  readonly concurrency: number | null;
  readonly quota: { readonly count: number; readonly period: Period } | null;
  readonly budgets: ReadonlyMap<string, { readonly amount: number; readonly period: Period }>;
  /** Alert thresholds in percent, ascending; empty when the key has none (or no quota or budget). */
  readonly alerts: readonly number[];
}

/** The thresholds of a key with a quota or budget whose record names none. */
const DEFAULT_ALERTS: readonly number[] = [80, 100];

const RATE = /^([1-9]\d{0,8})\/(s|m|h)$/;
const PER_PERIOD = /^(\d{1,12}(?:\.\d{1,6})?)\/(day|month)$/;
const SECONDS: Readonly<Record<string, number>> = { s: 1, m: 60, h: 3_600 };

const FIELDS = new Set(['rate', 'burst', 'concurrency', 'quota', 'budgets', 'alerts']);

/**
 * What is wrong with `limits` as stored, as a message tail (`.limits.rate
 * must be …`), or null. A field it does not know (`Quota`, `concurency`) or a
 * budget on a route that reports no cost (`SEO`, `scraper`) is a problem,
 * not something to skip: a typo in SQL must never silently lift a limit.
 * `costRoutes`: the routes whose upstream reports a cost (routes.ts).
 */
export function limitsProblem(limits: unknown, costRoutes: readonly string[]): string | null {
  if (limits === undefined || limits === null) return null;
  if (typeof limits !== 'object' || Array.isArray(limits)) return '.limits must be an object';
  const l = limits as Record<string, unknown>;
  const unknown = Object.keys(l).find((k) => !FIELDS.has(k));
  if (unknown !== undefined) return `.limits.${unknown} is not a limit (rate, burst, concurrency, quota, budgets, alerts)`;
  if (l.rate !== undefined && !(typeof l.rate === 'string' && RATE.test(l.rate))) return '.limits.rate must be N/s, N/m or N/h';
  if (l.burst !== undefined && !(Number.isInteger(l.burst) && (l.burst as number) > 0)) return '.limits.burst must be a whole number above 0';
  if (l.concurrency !== undefined && !(Number.isInteger(l.concurrency) && (l.concurrency as number) > 0)) return '.limits.concurrency must be a whole number above 0';
  if (l.quota !== undefined && !(typeof l.quota === 'string' && PER_PERIOD.test(l.quota) && Number.isInteger(Number(l.quota.split('/')[0])))) return '.limits.quota must be N/day or N/month';
  if (l.alerts !== undefined && !(Array.isArray(l.alerts) && l.alerts.length <= 10 && l.alerts.every((a) => Number.isInteger(a) && (a as number) >= 1 && (a as number) <= 100))) return '.limits.alerts must be a list of up to 10 whole percentages from 1 to 100';
  if (l.budgets !== undefined) {
    if (typeof l.budgets !== 'object' || l.budgets === null || Array.isArray(l.budgets)) return '.limits.budgets must be an object of route → AMOUNT/day|month';
    for (const [route, v] of Object.entries(l.budgets)) {
      if (!costRoutes.includes(route)) return `.limits.budgets.${route}: budgets apply to routes that report a cost (${costRoutes.join(', ')})`;
      if (!(typeof v === 'string' && PER_PERIOD.test(v))) return '.limits.budgets values must be AMOUNT/day or AMOUNT/month';
    }
  }
  return null;
}

const perPeriod = (text: string): { n: number; period: Period } => {
  const m = PER_PERIOD.exec(text) as RegExpExecArray;
  return { n: Number(m[1]), period: m[2] as Period };
};

/** The numbers admission reads, from limits that passed `limitsProblem`; null when the key has none. */
export function policyOf(limits: Limits | undefined | null): Policy | null {
  if (limits === undefined || limits === null) return null;
  const rate = limits.rate === undefined ? null : RATE.exec(limits.rate);
  const budgets = new Map(Object.entries(limits.budgets ?? {}).map(([route, text]) => {
    const { n, period } = perPeriod(text);
    return [route, { amount: n, period }] as const;
  }));
  const quota = limits.quota === undefined ? null : (({ n, period }) => ({ count: n, period }))(perPeriod(limits.quota));
  const policy: Policy = {
    rate: rate === null ? null : { count: Number(rate[1]), seconds: SECONDS[rate[2] as string] as number, burst: limits.burst ?? Number(rate[1]) },
    concurrency: limits.concurrency ?? null,
    quota,
    budgets,
    alerts: quota === null && budgets.size === 0 ? [] : [...new Set(limits.alerts ?? DEFAULT_ALERTS)].sort((a, b) => a - b),
  };
  return policy.rate === null && policy.concurrency === null && policy.quota === null && budgets.size === 0 ? null : policy;
}

/** The last period computed, by kind: most calls fall in it (a Date and a string per call otherwise). */
const LAST: Record<Period, { key: string; starts: number; ends: number } | null> = { day: null, month: null };

/** The UTC calendar period `at` falls in: its key (`2026-11-23` or `2026-11`) and when it ends, ms. */
export function periodOf(period: Period, at: number): { readonly key: string; readonly starts: number; readonly ends: number } {
  const last = LAST[period];
  if (last !== null && at >= last.starts && at < last.ends) return last;
  const d = new Date(at);
  const y = d.getUTCFullYear();
  const m = d.getUTCMonth();
  const next =
    period === 'month'
      ? { key: `${y}-${String(m + 1).padStart(2, '0')}`, starts: Date.UTC(y, m, 1), ends: Date.UTC(y, m + 1, 1) }
      : { key: d.toISOString().slice(0, 10), starts: Date.UTC(y, m, d.getUTCDate()), ends: Date.UTC(y, m, d.getUTCDate() + 1) };
  LAST[period] = next;
  return next;
}

const POLICIES = new WeakMap<object, Policy | null>();

/** A key's policy, parsed once per record (records are immutable; a change is a new record). */
export function policyFor(record: { readonly limits?: Limits }): Policy | null {
  let p = POLICIES.get(record);
  if (p === undefined) {
    p = policyOf(record.limits);
    POLICIES.set(record, p);
  }
  return p;
}
