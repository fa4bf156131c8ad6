// A usage store that keeps nothing past the process: the fallback when the
// ledger's file cannot be opened, and the tests' store.
import type { UsageRow, UsageStore } from './ledger.ts';

/** A store that keeps nothing past the process (no ledger file or table configured). */
export class MemoryUsageStore implements UsageStore {
  readonly location = 'memory';
  readonly #rows: UsageRow[] = [];

  add(rows: readonly UsageRow[]): Promise<void> {
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
