// A usage store that keeps nothing past the process: the fallback when the
// ledger's file cannot be opened, and the tests' store.
import { MemoryAlertStore } from './alerts.ts';
import type { BatchId, UsageRow, UsageStore } from './store.ts';

/** A store that keeps nothing past the process (no ledger file or table configured). */
export class MemoryUsageStore implements UsageStore {
  readonly location = 'memory';
  readonly alerts = new MemoryAlertStore();
  readonly #rows: UsageRow[] = [];
  /** The highest batch applied, per gateway: a batch sent again is not counted again. */
  readonly #applied = new Map<string, number>();

  add(rows: readonly UsageRow[], batch: BatchId): Promise<void> {
    if ((this.#applied.get(batch.gateway) ?? 0) >= batch.seq) return Promise.resolve();
    this.#applied.set(batch.gateway, batch.seq);
    this.#rows.push(...rows.map((r) => ({ ...r })));
    return Promise.resolve();
  }

  rows(filter: { since?: string; keyId?: string; route?: string }): Promise<UsageRow[]> {
    return Promise.resolve(this.#rows.filter((r) => r.day >= (filter.since ?? '') && (filter.keyId === undefined || r.keyId === filter.keyId) && (filter.route === undefined || r.route === filter.route)));
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}
