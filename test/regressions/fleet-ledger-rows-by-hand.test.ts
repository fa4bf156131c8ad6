// Rows written by hand into keyward's tables used to change what limits
// admit without a word: heartbeat rows dated in the future never expired
// (1,000 of them cut a 10/s key to nothing), and limit fields the record
// check did not know (`Quota`, `concurency`, a budget on `SEO`) were
// accepted and enforced as nothing. Both now fail safe (docs/fleet.md, "Who
// controls the fleet"; docs/keys.md).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { PgKeyStore } from '../../src/keys/pg-store.ts';
import { sharedUsageStore } from '../../src/ledger/open.ts';
import type { PgUsageStore } from '../../src/ledger/pg-usage.ts';
import { recordProblem } from '../../src/keys/record.ts';
import { startDatabase } from '../support/postgres.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';

const record = (limits: unknown): Record<string, unknown> => ({
  id: 'key_x',
  name: 'x',
  digest: `sha256:${'a'.repeat(64)}`,
  created: '2026-01-01T00:00:00.000Z',
  expires: null,
  revoked: null,
  limits,
});

test('limit fields the record check does not know fail it, so a typo never lifts a limit', () => {
  // The scraper's runs are settled after the fact (docs/limits.md, "Scraper runs"): a budget there is one like the others.
  assert.equal(recordProblem(record({ quota: '5/day', budgets: { seo: '1/day', speech: '100/month', scraper: '5/day' } }), costRoutes(UPSTREAMS)), null);
  const cases: Array<[unknown, RegExp]> = [
    [{ Quota: '5/day' }, /\.limits\.Quota is not a limit/],
    [{ concurency: 2 }, /\.limits\.concurency is not a limit|\.limits\.concurency/],
    [{ budgets: { SEO: '1/day' } }, /\.limits\.budgets\.SEO: budgets apply to routes that report a cost/],
    [{ budgets: { scrapper: '1/day' } }, /\.limits\.budgets\.scrapper: budgets apply to routes that report a cost/],
    [{ quota: '5/day', extra: true }, /\.limits\.extra is not a limit/],
  ];
  for (const [limits, problem] of cases) assert.match(recordProblem(record(limits), costRoutes(UPSTREAMS)) ?? 'accepted', problem, JSON.stringify(limits));
  assert.match(recordProblem(record({ concurency: 2 }), costRoutes(UPSTREAMS)) ?? '', /is not a limit/);
});

test('heartbeat rows dated ahead of the database clock are not counted as live gateways', { timeout: 60_000 }, async () => {
  const db = await startDatabase();
  const store = new PgKeyStore(db.url, costRoutes(UPSTREAMS));
  try {
    const usage = sharedUsageStore(store) as PgUsageStore;
    assert.equal(await usage.heartbeat('g1'), 1);
    assert.equal(await usage.heartbeat('g2'), 2);
    await db.admin`insert into keyward_gateways (id, seen) select 'fake-' || i, now() + interval '1 hour' from generate_series(1, 1000) i`;
    assert.equal(await usage.heartbeat('g1'), 2, 'a thousand rows in the future change nothing');
    await db.admin`update keyward_gateways set seen = now() - interval '1 minute' where id = 'g2'`;
    assert.equal(await usage.heartbeat('g1'), 1, 'a gateway not seen for a while has left');
  } finally {
    await store.close();
    await db.close();
  }
});
