// A usage store that keeps nothing past the process: the fallback when the
// ledger's file cannot be opened, and the tests' store.
import type { AlertRow, AlertStore, BatchId, UsageRow, UsageStore } from './store.ts';

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
    return Promise.resolve(
      this.#rows.filter(
        (r) =>
          r.day >= (filter.since ?? '') && (filter.keyId === undefined || r.keyId === filter.keyId) && (filter.route === undefined || r.route === filter.route),
      ),
    );
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}

/** Firings recorded in memory (a ledger that could not be opened): once per process. */
export class MemoryAlertStore implements AlertStore {
  readonly #rows = new Map<string, AlertRow & { delivered: boolean; until: number }>();

  claimAlert(alert: AlertRow): Promise<boolean> {
    if (this.#rows.has(alert.id)) return Promise.resolve(false);
    this.#rows.set(alert.id, { ...alert, delivered: false, until: 0 });
    return Promise.resolve(true);
  }

  alertDelivered(id: string): Promise<void> {
    const row = this.#rows.get(id);
    if (row !== undefined) row.delivered = true;
    return Promise.resolve();
  }

  undeliveredAlerts(_by: string, since: number, forMs: number): Promise<AlertRow[]> {
    const now = Date.now();
    const out: AlertRow[] = [];
    for (const r of this.#rows.values()) {
      if (r.delivered || r.at < since || r.until > now) continue;
      r.until = now + forMs;
      out.push({ id: r.id, keyId: r.keyId, body: r.body, at: r.at });
    }
    return Promise.resolve(out);
  }
}
