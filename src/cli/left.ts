// What is left of a key's quota and budgets this period (`keys list`,
// docs/limits.md), from the ledger's stored rows.
import type { KeyRecord } from '../keys/keyset.ts';
import { periodOf, policyFor } from '../limits/policy.ts';
import { periodUse, usageFrom } from '../ledger/ledger.ts';
import { micro } from '../lib/format.ts';
import type { UsageRow } from '../ledger/store.ts';

export interface Left {
  readonly quota?: number;
  readonly budgets?: Readonly<Record<string, number>>;
}

/** For a key with a quota or budgets: what is left of each in the current period; null otherwise. */
export function leftFor(key: KeyRecord, rows: readonly UsageRow[], now = Date.now()): Left | null {
  const policy = policyFor(key);
  if (policy === null || (policy.quota === null && policy.budgets.size === 0)) return null;
  const use = periodUse(
    usageFrom(
      rows.filter((r) => r.keyId === key.id),
      now,
    ),
  );
  const out: { quota?: number; budgets?: Record<string, number> } = {};
  if (policy.quota !== null) out.quota = Math.max(0, policy.quota.count - use.requests(key.id, policy.quota.period, now));
  for (const [route, b] of policy.budgets) (out.budgets ??= {})[route] = Math.max(0, micro(b.amount - use.cost(key.id, route, b.period, now)));
  return out;
}

/** Where a key's quota or one of its budgets stands this period, as `GET /keyward/key` names the figures. */
export interface PeriodState {
  readonly kind: 'quota' | 'budget';
  readonly route?: string;
  readonly value: string;
  readonly used: number;
  readonly remaining: number;
  readonly period: 'day' | 'month';
  readonly resetsAt: string;
}

/** Each of the key's quota and budgets this period, from the ledger's stored rows (the admin API's key view). */
export function periodStates(key: KeyRecord, rows: readonly UsageRow[], now = Date.now()): PeriodState[] {
  const policy = policyFor(key);
  if (policy === null) return [];
  const use = periodUse(
    usageFrom(
      rows.filter((r) => r.keyId === key.id),
      now,
    ),
  );
  const out: PeriodState[] = [];
  const resets = (period: 'day' | 'month'): string => new Date(periodOf(period, now).ends).toISOString();
  if (policy.quota !== null) {
    const used = use.requests(key.id, policy.quota.period, now);
    out.push({
      kind: 'quota',
      value: key.limits?.quota ?? '',
      used,
      remaining: Math.max(0, policy.quota.count - used),
      period: policy.quota.period,
      resetsAt: resets(policy.quota.period),
    });
  }
  for (const [route, b] of policy.budgets) {
    const used = micro(use.cost(key.id, route, b.period, now));
    out.push({
      kind: 'budget',
      route,
      value: key.limits?.budgets?.[route] ?? '',
      used,
      remaining: Math.max(0, micro(b.amount - used)),
      period: b.period,
      resetsAt: resets(b.period),
    });
  }
  return out;
}
