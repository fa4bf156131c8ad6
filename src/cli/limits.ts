// The limit flags of `keys create` and `keys update` (docs/limits.md):
// checked before the store is opened, turned into changes of a key's limits.
import type { ParseArgsOptionsConfig } from 'node:util';
import { UPSTREAMS } from '../routes.ts';
import type { Left } from '../usage/left.ts';
import { limitsProblem, type Limits } from '../usage/policy.ts';
import { UsageError } from './args.ts';

export const LIMIT_OPTIONS = {
  rate: { type: 'string' },
  burst: { type: 'string' },
  concurrency: { type: 'string' },
  quota: { type: 'string' },
  budget: { type: 'string', multiple: true },
} as const satisfies ParseArgsOptionsConfig;

/** Per field: a new value, or null to remove it (`none`); budgets by route. Absent: unchanged. */
export interface LimitChanges {
  readonly rate?: string | null;
  readonly burst?: number | null;
  readonly concurrency?: number | null;
  readonly quota?: string | null;
  readonly budgets?: Readonly<Record<string, string | null>>;
}

const whole = (name: string, text: string, help: string): number => {
  if (!/^[1-9]\d{0,8}$/.test(text)) throw new UsageError(`--${name} must be a whole number above 0, or none`, help);
  return Number(text);
};

/** The limit flags of a parsed command; `allowNone` on update, where `none` removes a limit. */
export function limitChanges(values: Record<string, unknown>, help: string, allowNone: boolean): LimitChanges {
  const text = (name: string): string | null | undefined => {
    const v = values[name];
    if (typeof v !== 'string') return undefined;
    if (v === 'none') {
      if (!allowNone) throw new UsageError(`--${name} none only removes a limit on keys update`, help);
      return null;
    }
    return v;
  };
  const changes: { -readonly [K in keyof LimitChanges]: LimitChanges[K] } = {};
  const rate = text('rate');
  if (rate !== undefined) {
    if (rate !== null && limitsProblem({ rate }) !== null) throw new UsageError('--rate must be N/s, N/m or N/h (e.g. 10/s), or none', help);
    changes.rate = rate;
  }
  const burst = text('burst');
  if (burst !== undefined) changes.burst = burst === null ? null : whole('burst', burst, help);
  const concurrency = text('concurrency');
  if (concurrency !== undefined) changes.concurrency = concurrency === null ? null : whole('concurrency', concurrency, help);
  const quota = text('quota');
  if (quota !== undefined) {
    if (quota !== null && limitsProblem({ quota }) !== null) throw new UsageError('--quota must be N/day or N/month (e.g. 1000/day), or none', help);
    changes.quota = quota;
  }
  const budgets = values.budget;
  if (Array.isArray(budgets)) {
    const byRoute: Record<string, string | null> = {};
    const costly = UPSTREAMS.filter((u) => u.cost !== null).map((u) => u.name);
    for (const b of budgets as string[]) {
      const m = /^([a-z0-9-]+)=(.+)$/.exec(b);
      if (m === null) throw new UsageError('--budget must be ROUTE=AMOUNT/day or ROUTE=AMOUNT/month (e.g. seo=5/day)', help);
      const [, route, amount] = m as unknown as [string, string, string];
      if (!costly.includes(route)) throw new UsageError(`--budget: ${route} reports no cost; budgets apply to ${costly.join(', ')}`, help);
      if (amount === 'none') {
        if (!allowNone) throw new UsageError('--budget ROUTE=none only removes a budget on keys update', help);
        byRoute[route] = null;
      } else if (limitsProblem({ budgets: { [route]: amount } }) !== null) {
        throw new UsageError('--budget must be ROUTE=AMOUNT/day or ROUTE=AMOUNT/month (e.g. seo=5/day)', help);
      } else byRoute[route] = amount;
    }
    changes.budgets = byRoute;
  }
  return changes;
}

/** `limits` with `changes` applied; undefined when nothing is left. */
export function applyLimits(limits: Limits | undefined, changes: LimitChanges): Limits | undefined {
  const next: Record<string, unknown> = { ...limits };
  for (const field of ['rate', 'burst', 'concurrency', 'quota'] as const) {
    const v = changes[field];
    if (v === null) delete next[field];
    else if (v !== undefined) next[field] = v;
  }
  // A burst belongs to its rate.
  if (next.rate === undefined) delete next.burst;
  if (changes.budgets !== undefined) {
    const budgets: Record<string, string> = { ...limits?.budgets };
    for (const [route, v] of Object.entries(changes.budgets)) {
      if (v === null) delete budgets[route];
      else budgets[route] = v;
    }
    if (Object.keys(budgets).length === 0) delete next.budgets;
    else next.budgets = budgets;
  }
  return Object.keys(next).length === 0 ? undefined : (next as Limits);
}

/** One line for `keys list` and the create/update messages: `rate 10/s burst 20, quota 1000/day (988 left), budget seo 5/day`. */
export function describeLimits(limits: Limits | undefined, left: Left | null = null): string {
  if (limits === undefined) return 'none';
  const parts: string[] = [];
  if (limits.rate !== undefined) parts.push(`rate ${limits.rate}${limits.burst !== undefined ? ` burst ${limits.burst}` : ''}`);
  if (limits.concurrency !== undefined) parts.push(`concurrency ${limits.concurrency}`);
  if (limits.quota !== undefined) parts.push(`quota ${limits.quota}${left?.quota !== undefined ? ` (${left.quota} left)` : ''}`);
  for (const [route, b] of Object.entries(limits.budgets ?? {})) parts.push(`budget ${route} ${b}${left?.budgets?.[route] !== undefined ? ` (${left.budgets[route]} left)` : ''}`);
  return parts.join(', ');
}
