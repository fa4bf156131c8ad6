// What is left of a key's quota and budgets this period (`keys list`,
// docs/limits.md), from the ledger's stored rows.
import type { KeyRecord } from '../keys/keyset.ts';
import { policyFor } from '../limits/policy.ts';
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
