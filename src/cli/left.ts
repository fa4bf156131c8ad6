// What is left of a key's quota and budgets this period (`keys list`,
// docs/limits.md), from the ledger's stored rows.
import type { KeyRecord } from '../keys/keyset.ts';
import { periodOf, policyFor } from '../limits/policy.ts';
import type { UsageRow } from '../ledger/store.ts';

export interface Left {
  readonly quota?: number;
  readonly budgets?: Readonly<Record<string, number>>;
}

/** For a key with a quota or budgets: what is left of each in the current period; null otherwise. */
export function leftFor(key: KeyRecord, rows: readonly UsageRow[], now = Date.now()): Left | null {
  const policy = policyFor(key);
  if (policy === null || (policy.quota === null && policy.budgets.size === 0)) return null;
  const day = periodOf('day', now).key;
  const month = periodOf('month', now).key;
  const inPeriod = (r: UsageRow, period: 'day' | 'month'): boolean => r.keyId === key.id && (period === 'day' ? r.day === day : r.day.startsWith(month));
  const out: { quota?: number; budgets?: Record<string, number> } = {};
  if (policy.quota !== null) {
    const q = policy.quota;
    out.quota = Math.max(0, q.count - rows.filter((r) => inPeriod(r, q.period)).reduce((a, r) => a + r.requests, 0));
  }
  for (const [route, b] of policy.budgets) {
    const spent = rows.filter((r) => r.route === route && inPeriod(r, b.period)).reduce((a, r) => a + r.cost, 0);
    (out.budgets ??= {})[route] = Math.max(0, Math.round((b.amount - spent) * 1e6) / 1e6);
  }
  return out;
}
