// The one backoff (src/lib/backoff.ts): doubling, jittered, and capped after the jitter.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { backoff } from '../../src/lib/backoff.ts';
import { RETRY } from '../../src/alerts/webhook.ts';

test('waits double from the first, within the jitter, and never pass the cap, jitter included', () => {
  assert.equal(backoff(1, { firstMs: 250, maxMs: 30_000 }), 250);
  assert.equal(backoff(3, { firstMs: 250, maxMs: 30_000 }), 1_000);
  assert.equal(backoff(20, { firstMs: 250, maxMs: 30_000 }), 30_000);
  fc.assert(
    fc.property(fc.integer({ min: 1, max: 40 }), fc.double({ min: 0, max: 0.999999, noNaN: true }), (attempt, r) => {
      const wait = backoff(attempt, RETRY, () => r);
      const base = 1_000 * 2 ** (attempt - 1);
      assert.ok(wait <= 5 * 60_000, `attempt ${attempt}: ${wait} ms`);
      assert.ok(wait >= Math.min(5 * 60_000, base * 0.75) - 1e-9 || wait === 5 * 60_000);
    }),
  );
  // The webhook's, at the cap with the highest jitter: 5 minutes, not 6.25 (docs/limits.md).
  assert.equal(
    backoff(12, RETRY, () => 0.999999),
    5 * 60_000,
  );
});
