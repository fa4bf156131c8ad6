// A key's limits (docs/limits.md) parsed once into the numbers admission
// reads, and the calendar periods quotas and budgets count in. Pure.
import { perPeriod, RATE, SECONDS, type Limits, type Period } from '../keys/limits.ts';

export type { Period } from '../keys/limits.ts';

export interface Policy {
  readonly rate: { readonly count: number; readonly seconds: number; readonly burst: number } | null;
  readonly concurrency: number | null;
  readonly quota: { readonly count: number; readonly period: Period } | null;
  readonly budgets: ReadonlyMap<string, { readonly amount: number; readonly period: Period }>;
  /** The most one scraper run may be capped at, US dollars (`--run-cap`); null: a tenth of the budget unless the client asks. */
  readonly runCap: number | null;
  /** Alert thresholds in percent, ascending; empty when the key has none (or no quota or budget). */
  readonly alerts: readonly number[];
}

/** The thresholds of a key with a quota or budget whose record names none. */
const DEFAULT_ALERTS: readonly number[] = [80, 100];

/** The numbers admission reads, from limits that passed `limitsProblem`; null when the key has none. */
export function policyOf(limits: Limits | undefined | null): Policy | null {
  if (limits === undefined || limits === null) return null;
  const rate = limits.rate === undefined ? null : RATE.exec(limits.rate);
  const budgets = new Map(
    Object.entries(limits.budgets ?? {}).map(([route, text]) => {
      const { n, period } = perPeriod(text);
      return [route, { amount: n, period }] as const;
    }),
  );
  const quota = limits.quota === undefined ? null : (({ n, period }) => ({ count: n, period }))(perPeriod(limits.quota));
  const policy: Policy = {
    rate: rate === null ? null : { count: Number(rate[1]), seconds: SECONDS[rate[2] as string] as number, burst: limits.burst ?? Number(rate[1]) },
    concurrency: limits.concurrency ?? null,
    quota,
    budgets,
    runCap: limits.runCap ?? null,
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
