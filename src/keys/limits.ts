// A key's limits as stored on its record (docs/limits.md): readable
// strings, written on the command line or in SQL, and the one check of
// them that both stores run. Parsed into the numbers admission reads by
// limits/policy.ts. Pure.
import { parseRange } from '../lib/addresses.ts';

export type Period = 'day' | 'month';

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
  /** The most one scraper run may be capped at, US dollars (`--run-cap`, docs/limits.md "Scraper runs"). */
  readonly runCap?: number;
  /**
   * The client addresses the key may be used from, as ranges (`10.0.0.0/8`,
   * `2001:db8::/32`; docs/keys.md "Allowed addresses"). Kept with the
   * limits so that a keyward too old to enforce it refuses the key
   * (key_unsupported) rather than serve it from anywhere.
   */
  readonly allowFrom?: readonly string[];
}

/** The most ranges one key's allowlist holds. */
export const ALLOW_FROM_MAX = 64;

/** What is wrong with an allowlist as stored, or null. */
export function allowFromProblem(v: unknown): string | null {
  if (!Array.isArray(v) || v.length === 0 || v.length > ALLOW_FROM_MAX || !v.every((r) => typeof r === 'string' && parseRange(r) !== null))
    return `.limits.allowFrom must be a list of 1 to ${ALLOW_FROM_MAX} address ranges (10.0.0.0/8, 2001:db8::/32, or one address; no zone id, and no IPv6 range that takes in the IPv4-mapped ::ffff:0:0/96)`;
  return null;
}

export const RATE = /^([1-9]\d{0,8})\/(s|m|h)$/;
const PER_PERIOD = /^(\d{1,12}(?:\.\d{1,6})?)\/(day|month)$/;
/** An amount in US dollars as a key record holds it: to the micro-dollar, no exponent. */
const AMOUNT = /^\d{1,9}(?:\.\d{1,6})?$/;
export const SECONDS: Readonly<Record<string, number>> = { s: 1, m: 60, h: 3_600 };

const FIELDS = new Set(['rate', 'burst', 'concurrency', 'quota', 'budgets', 'alerts', 'runCap', 'allowFrom']);

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
  if (unknown !== undefined) return `.limits.${unknown} is not a limit (rate, burst, concurrency, quota, budgets, alerts, runCap, allowFrom)`;
  if (l.allowFrom !== undefined) {
    const p = allowFromProblem(l.allowFrom);
    if (p !== null) return p;
  }
  if (l.rate !== undefined && !(typeof l.rate === 'string' && RATE.test(l.rate))) return '.limits.rate must be N/s, N/m or N/h';
  if (l.burst !== undefined && !(Number.isInteger(l.burst) && (l.burst as number) > 0)) return '.limits.burst must be a whole number above 0';
  if (l.concurrency !== undefined && !(Number.isInteger(l.concurrency) && (l.concurrency as number) > 0))
    return '.limits.concurrency must be a whole number above 0';
  if (l.quota !== undefined && !(typeof l.quota === 'string' && PER_PERIOD.test(l.quota) && Number.isInteger(Number(l.quota.split('/')[0]))))
    return '.limits.quota must be N/day or N/month';
  if (
    l.alerts !== undefined &&
    !(Array.isArray(l.alerts) && l.alerts.length <= 10 && l.alerts.every((a) => Number.isInteger(a) && (a as number) >= 1 && (a as number) <= 100))
  )
    return '.limits.alerts must be a list of up to 10 whole percentages from 1 to 100';
  if (l.runCap !== undefined && !(typeof l.runCap === 'number' && l.runCap > 0 && AMOUNT.test(String(l.runCap))))
    return '.limits.runCap must be an amount above 0 with at most six decimals';
  if (l.budgets !== undefined) {
    if (typeof l.budgets !== 'object' || l.budgets === null || Array.isArray(l.budgets)) return '.limits.budgets must be an object of route → AMOUNT/day|month';
    for (const [route, v] of Object.entries(l.budgets)) {
      if (!costRoutes.includes(route)) return `.limits.budgets.${route}: budgets apply to routes that report a cost (${costRoutes.join(', ')})`;
      if (!(typeof v === 'string' && PER_PERIOD.test(v))) return '.limits.budgets values must be AMOUNT/day or AMOUNT/month';
    }
  }
  return null;
}

export const perPeriod = (text: string): { n: number; period: Period } => {
  const m = PER_PERIOD.exec(text) as RegExpExecArray;
  return { n: Number(m[1]), period: m[2] as Period };
};
