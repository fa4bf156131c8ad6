// A key's figures as the store holds them (views/key-status.ts, StoreView):
// a scraper run's cap in a fleet is read by a query that starts with its
// admission (docs/limits.md, "Scraper runs"), never from a read already
// under way, which may have begun before another gateway settled a run.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { UsageRow } from '../../src/ledger/store.ts';
import { StoreView } from '../../src/views/key-status.ts';
import { usageRow } from '../support/rows.ts';

const day = new Date().toISOString().slice(0, 10);
const row = (cost: number): UsageRow => usageRow({ keyId: 'k', route: 'scraper', day, cost });

test('refresh waits for a read that starts with it, not for one under way; cached answers from the newer read', async () => {
  // The store's answers, held until the test releases them: the first read sees 0.4, later ones 0.6.
  const pending: Array<(rows: UsageRow[]) => void> = [];
  const store = { rows: () => new Promise<UsageRow[]>((resolve) => pending.push(resolve)) };
  const view = new StoreView(store, null, 60_000);
  const now = Date.now();
  // A read under way (a status, an alert check), started before the other gateway's settlement.
  assert.equal(view.cached('k', now), null);
  assert.equal(pending.length, 1);
  // A run's admission: within the TTL of that read, it still asks the store again.
  const fresh = view.refresh('k', now);
  assert.equal(pending.length, 2, 'a second query, started for the admission');
  (pending[1] as (rows: UsageRow[]) => void)([row(0.6)]);
  await fresh;
  assert.equal(view.cached('k', now)?.routes.get('scraper')?.today.cost, 0.6);
  // The older read ending later never replaces the newer rows.
  (pending[0] as (rows: UsageRow[]) => void)([row(0.4)]);
  await new Promise((r) => setImmediate(r));
  assert.equal(view.cached('k', now)?.routes.get('scraper')?.today.cost, 0.6);
});
