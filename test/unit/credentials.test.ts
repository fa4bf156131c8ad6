// docs/credentials.md: the board's choice and set-asides, and how long an
// upstream's answer sets a credential aside. Pure: a route and a clock.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { asideUntil, CredentialBoard, RETRY_AFTER_MAX_MS } from '../../src/request/credentials.ts';
import type { Credential, Route } from '../../src/request/routes.ts';

const creds = (n: number): Credential[] => Array.from({ length: n }, (_, i) => ({ label: i + 1, header: ['xi-api-key', `k${i + 1}`] as const, forms: [] }));
const route = (n: number): Route => ({ name: 'speech', credentials: creds(n) }) as unknown as Route;
const S = { credentialOrder: 'spread', credentialCooldownMs: 30_000, credentialPaymentCooldownMs: 3_600_000 } as const;
const NOW = Date.parse('2026-11-27T12:00:00Z');

test('asideUntil: 401 for good, 402 the payment cooldown, 429 its Retry-After in seconds or as a date, bounded from 1 s to 24 h', () => {
  assert.equal(asideUntil(401, undefined, NOW, S), Infinity);
  assert.equal(asideUntil(402, '5', NOW, S), NOW + 3_600_000);
  assert.equal(asideUntil(429, '7', NOW, S), NOW + 7_000);
  assert.equal(asideUntil(429, new Date(NOW + 90_000).toUTCString(), NOW, S), NOW + 90_000);
  assert.equal(asideUntil(429, undefined, NOW, S), NOW + 30_000, 'none: the cooldown');
  assert.equal(asideUntil(429, 'soon', NOW, S), NOW + 30_000, 'not a number or date: the cooldown');
  assert.equal(asideUntil(429, new Date(NOW - 60_000).toUTCString(), NOW, S), NOW + 30_000, 'a date gone by: the cooldown');
  assert.equal(asideUntil(429, '0', NOW, S), NOW + 30_000);
  assert.equal(asideUntil(429, '99999999', NOW, S), NOW + RETRY_AFTER_MAX_MS, 'a hostile Retry-After cannot shelve an account for good');
  assert.equal(asideUntil(429, '1e9', NOW, S), NOW + 30_000);
  assert.equal(asideUntil(429, '-5', NOW, S), NOW + 30_000, 'negative: the cooldown');
  assert.equal(asideUntil(429, new Date(NOW + 5 * 365 * 86_400_000).toUTCString(), NOW, S), NOW + RETRY_AFTER_MAX_MS, 'a date years ahead: the bound');
});

test('spread: the fewest in flight, ties in turn; first: the lowest-numbered available; tried ones skipped', () => {
  const b = new CredentialBoard();
  const r = route(3);
  const picks = Array.from({ length: 6 }, () => b.choose(r, 'spread', null, NOW)?.label);
  assert.deepEqual(picks, [1, 2, 3, 1, 2, 3]);
  const one = b.choose(r, 'spread', null, NOW) as Credential;
  b.take(r, one);
  b.take(r, one);
  const two = b.choose(r, 'spread', null, NOW) as Credential;
  assert.notEqual(two.label, one.label, 'busy credential avoided');
  b.give(r, one);
  b.give(r, one);
  b.give(r, one); // never below zero
  assert.equal(b.choose(r, 'first', null, NOW)?.label, 1);
  assert.equal(b.choose(r, 'first', new Set([1]), NOW)?.label, 2);
  assert.equal(b.choose(r, 'spread', new Set([1, 2, 3]), NOW), null);
  // One credential: always it, nothing counted.
  assert.equal(b.choose(route(1), 'spread', null, NOW)?.label, 1);
});

test('set aside until an instant, a later instant wins, back when it passes; a reload brings back the 401s only', () => {
  const b = new CredentialBoard();
  const r = route(3);
  const told: Array<[number, boolean]> = [];
  b.onAside((a, shared) => told.push([a.label, shared]));
  b.setAside({ route: 'speech', label: 1, status: 429, until: NOW + 10_000 });
  b.setAside({ route: 'speech', label: 1, status: 429, until: NOW + 5_000 });
  assert.deepEqual(told, [[1, false]], 'an earlier instant changes nothing');
  b.apply({ route: 'speech', label: 2, status: 401, until: Infinity });
  b.apply({ route: 'speech', label: 3, status: 402, until: NOW + 60_000 });
  assert.deepEqual(told.at(-1), [3, true]);
  assert.equal(b.availableCount(r, NOW), 0);
  assert.equal(b.choose(r, 'spread', null, NOW), null);
  assert.equal(b.retryAfter(r, NOW), 10, 'the first to come back');
  assert.equal(b.availableCount(r, NOW + 10_000), 1);
  assert.equal(b.choose(r, 'first', null, NOW + 10_000)?.label, 1);
  b.reloaded();
  assert.equal(b.available('speech', 2, NOW + 10_000), true);
  assert.equal(b.available('speech', 3, NOW + 10_000), false);
  assert.deepEqual(
    b.current(NOW + 10_000).map((a) => a.label),
    [3],
  );
  const onlyReload = new CredentialBoard();
  onlyReload.apply({ route: 'speech', label: 1, status: 401, until: Infinity });
  onlyReload.apply({ route: 'speech', label: 2, status: 401, until: Infinity });
  assert.equal(onlyReload.retryAfter(route(2), NOW), null, 'no Retry-After when each waits for a reload');
});
