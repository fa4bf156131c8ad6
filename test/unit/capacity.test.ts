// capacity/capacity.ts: the queue's order and its bookkeeping, with a clock
// of the test's own. Round robin over keys, first in first out within one,
// a retry first among its key's, room given back, a full queue, a rate.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { Capacity, capacityStates, type CapacitySettings } from '../../src/capacity/capacity.ts';
import { parseRate, type RouteCapacity } from '../../src/capacity/plan.ts';

const settings: CapacitySettings = { credentialOrder: 'spread', queueWaitMs: 60_000, queueMax: 1000 };
const limits = (...c: Array<number | null>): RouteCapacity => c.map((concurrency) => ({ concurrency, rate: null }));

/** A capacity on route `r` whose answers are recorded in order: `who:label`, or `who:busy`. */
function harness(capacity: RouteCapacity, s = settings, available: (label: number) => boolean = () => true) {
  let now = 1_000_000;
  const log: string[] = [];
  const c = new Capacity(
    s,
    (_r, label) => available(label),
    {},
    () => now,
  );
  c.configure([{ name: 'r', capacity }], s);
  const ask = (who: string, key = who.replace(/\d+$/, ''), front = false) =>
    c.ask('r', key, front, (label) => log.push(`${who}:${label === 0 ? 'busy' : label}`));
  return { c, log, ask, tick: (ms: number) => (now += ms) };
}

test('round robin over keys, first in first out within a key: a burst cannot push a single request back', () => {
  const { c, log, ask } = harness(limits(1));
  ask('a0');
  for (let i = 1; i <= 5; i++) ask(`a${i}`);
  ask('b0');
  ask('c0');
  ask('b1');
  assert.deepEqual(log, ['a0:1']);
  for (let i = 0; i < 8; i++) c.release('r', 1);
  assert.deepEqual(log, ['a0:1', 'a1:1', 'b0:1', 'c0:1', 'a2:1', 'b1:1', 'a3:1', 'a4:1', 'a5:1']);
});

test('whatever the keys and their order, each key is served in its own order and no key waits more than one turn per other key', () => {
  fc.assert(
    fc.property(fc.array(fc.integer({ min: 0, max: 4 }), { minLength: 1, maxLength: 60 }), (keys) => {
      const { c, log, ask } = harness(limits(1));
      ask('x'); // holds the only room: everything else waits
      keys.forEach((k, i) => ask(`${k}-${i}`, `k${k}`));
      for (let i = 0; i < keys.length; i++) c.release('r', 1);
      const served = log.slice(1).map((l) => l.split(':')[0] as string);
      assert.equal(served.length, keys.length);
      // Within a key: the order it asked in.
      for (let k = 0; k <= 4; k++) {
        const mine = served.filter((s) => s.startsWith(`${k}-`)).map((s) => Number(s.split('-')[1]));
        assert.deepEqual(
          mine,
          [...mine].sort((a, b) => a - b),
        );
      }
      // Between two turns of one key, every other key still waiting gets one.
      const distinct = new Set(keys).size;
      for (let i = 0; i + distinct <= served.length; i++) {
        const window = served.slice(i, i + distinct).map((s) => s.split('-')[0]);
        const stillWaiting = new Set(served.slice(i).map((s) => s.split('-')[0]));
        if (stillWaiting.size === distinct) assert.equal(new Set(window).size, distinct);
      }
    }),
  );
});

test('spread takes the credential with the most room; first the lowest-numbered; a credential set aside has none', () => {
  const spread = harness(limits(2, 4));
  spread.ask('a');
  spread.ask('b');
  spread.ask('c');
  assert.deepEqual(spread.log, ['a:2', 'b:2', 'c:1']);
  const first = harness(limits(2, 4), { ...settings, credentialOrder: 'first' });
  for (const w of ['a', 'b', 'c']) first.ask(w);
  assert.deepEqual(first.log, ['a:1', 'b:1', 'c:2']);
  const aside = harness(limits(2, 4), settings, (label) => label !== 2);
  for (const w of ['a', 'b', 'c']) aside.ask(w);
  assert.deepEqual(aside.log, ['a:1', 'b:1']);
  assert.equal(aside.c.view('r')?.queued, 1);
});

test('a retry goes first among its own key, not before other keys; a cancelled request leaves nothing behind', () => {
  const { c, log, ask } = harness(limits(1));
  ask('a0');
  ask('a1');
  const b = ask('b0');
  ask('a2', 'a', true);
  assert.ok(b !== null);
  c.cancel('r', b);
  c.cancel('r', b); // twice: nothing
  c.release('r', 1);
  c.release('r', 1);
  c.release('r', 1);
  assert.deepEqual(log, ['a0:1', 'a2:1', 'a1:1']);
  assert.deepEqual(c.view('r'), { inFlight: [0], limit: [1], queued: 0 });
  // More releases than grants never go below zero.
  c.release('r', 1);
  assert.deepEqual(c.view('r')?.inFlight, [0]);
});

test('a full queue, and a wait of 0, answer busy at once; a route without a capacity answers busy', () => {
  const full = harness(limits(1), { ...settings, queueMax: 2 });
  for (const w of ['a', 'b', 'c', 'd']) full.ask(w);
  assert.deepEqual(full.log, ['a:1', 'd:busy']);
  const none = harness(limits(1), { ...settings, queueWaitMs: 0 });
  none.ask('a');
  none.ask('b');
  assert.deepEqual(none.log, ['a:1', 'b:busy']);
  const log: string[] = [];
  new Capacity(settings, () => true).ask('nowhere', 'k', false, (label, retry) => log.push(`${label}/${retry}`));
  assert.deepEqual(log, ['0/1']);
});

test('a rate: a burst of one second, then a token per 1/rate; Retry-After from the next token', () => {
  const rate = parseRate('2/s');
  assert.ok(rate !== null);
  const { c, log, ask, tick } = harness([{ concurrency: null, rate }], { ...settings, queueWaitMs: 0 });
  for (const w of ['a', 'b', 'c']) ask(w);
  assert.deepEqual(log, ['a:1', 'b:1', 'c:busy']);
  tick(499);
  ask('d');
  tick(1);
  ask('e');
  assert.deepEqual(log.slice(3), ['d:busy', 'e:1']);
  const retry: number[] = [];
  c.ask('r', 'f', false, (_l, r) => retry.push(r));
  assert.deepEqual(retry, [1]);
  assert.deepEqual(capacityStates(c), { r: { inFlight: 3, limit: null, queued: 0 } });
  const slow = parseRate('1/m');
  assert.deepEqual([slow?.perSecond, slow?.burst], [1 / 60, 1]);
  const h = harness([{ concurrency: null, rate: slow ?? rate }], { ...settings, queueWaitMs: 0 });
  h.ask('a');
  const after: number[] = [];
  h.c.ask('r', 'b', false, (_l, r) => after.push(r));
  assert.deepEqual(after, [60]);
});

test('a reload keeps what is in flight; a route whose options went away lets its waiting go and is no longer listed', () => {
  const { c, log, ask } = harness(limits(1));
  ask('a');
  ask('b');
  c.configure([{ name: 'r', capacity: limits(2) }], settings);
  assert.deepEqual(log, ['a:1', 'b:1']);
  ask('c');
  c.configure([{ name: 'r', capacity: null }], settings);
  assert.deepEqual(log, ['a:1', 'b:1', 'c:1']);
  assert.deepEqual(c.routes(), []);
  assert.equal(capacityStates(c), null);
});

test("a full queue sheds the longest key's newest request, not another key's only one; a key cannot push out its own", () => {
  const { c, log, ask } = harness(limits(1), { ...settings, queueMax: 3 });
  for (let i = 0; i < 5; i++) ask(`a${i}`);
  assert.deepEqual(log, ['a0:1', 'a4:busy']);
  ask('b0');
  ask('c0');
  ask('d0');
  assert.deepEqual(log, ['a0:1', 'a4:busy', 'a3:busy', 'a2:busy', 'd0:busy']);
  for (let i = 0; i < 3; i++) c.release('r', 1);
  assert.deepEqual(log.slice(5), ['a1:1', 'b0:1', 'c0:1']);
});

test("a key's burst of 5,000 against a queue of 1,000: another key's single request waits behind two of them at most", () => {
  const { c, log, ask } = harness(limits(1));
  for (let i = 0; i < 5000; i++) ask(`a${i}`);
  assert.equal(log.filter((l) => l.endsWith(':busy')).length, 5000 - 1 - 1000);
  ask('b0');
  assert.equal(c.view('r')?.queued, 1000);
  let served = 0;
  while (!log.includes('b0:1')) {
    c.release('r', 1);
    served++;
  }
  assert.ok(served <= 2, `served after ${served} releases`);
});
