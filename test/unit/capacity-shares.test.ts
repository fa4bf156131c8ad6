// capacity/fleet.ts: a credential's capacity split between gateways. With a
// store in memory that behaves as PostgreSQL's does for it (one rebalance
// at a time per credential, leases swept at expiry), gateways asking,
// releasing and rebalancing in any order never hold more than the limit
// between them, and never have more in flight.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { Capacity, type Demand } from '../../src/capacity/capacity.ts';
import { FleetShares, shareKey, shareOf, type Other, type Settled, type ShareStore } from '../../src/capacity/fleet.ts';
import { UNWATCHED } from '../../src/observe/outages.ts';

test('shareOf: never more than the others leave, never less than in use when it is free, wants met when they fit', () => {
  fc.assert(
    fc.property(
      fc.integer({ min: 1, max: 20 }),
      fc.nat({ max: 20 }),
      fc.nat({ max: 20 }),
      fc.array(fc.record({ held: fc.nat({ max: 20 }), want: fc.nat({ max: 20 }) }), { maxLength: 4 }),
      (limit, inUse, want, raw) => {
        // The others never hold more than the limit between them (the invariant the store keeps).
        let left = limit;
        const others: Other[] = raw.map((o) => {
          const held = Math.min(o.held, left);
          left -= held;
          return { held, want: o.want };
        });
        const held = shareOf(limit, { inUse, want }, others);
        const othersHeld = others.reduce((n, o) => n + o.held, 0);
        assert.ok(held >= 0 && held + othersHeld <= limit);
        if (inUse <= limit - othersHeld) assert.ok(held >= inUse);
        const wants = others.reduce((n, o) => n + o.want, 0) + want;
        if (wants <= limit && othersHeld + want <= limit) assert.ok(held >= want);
      },
    ),
  );
});

/** PostgreSQL's part, in memory: leases by gateway, swept at expiry by the store's clock, one rebalance at a time. */
class MemoryShares implements ShareStore {
  readonly leases = new Map<string, Map<string, { held: number; want: number; expires: number }>>();
  now = 0;
  #queue: Promise<void> = Promise.resolve();
  failing = new Set<string>();
  /** Told of each gateway whose lease was swept (expired unrenewed). */
  onSwept: (gateway: string) => void = () => undefined;

  rebalance(gateway: string, demands: readonly Demand[], decide: (others: ReadonlyMap<string, readonly Other[]>) => Settled[], ttlS: number): Promise<void> {
    const run = async (): Promise<void> => {
      await Promise.resolve();
      if (this.failing.has(gateway)) throw new Error('unreachable');
      for (const [g, mine] of this.leases)
        for (const [k, l] of mine)
          if (l.expires < this.now) {
            mine.delete(k);
            this.onSwept(g);
          }
      const others = new Map<string, Other[]>();
      for (const [g, mine] of this.leases) {
        if (g === gateway) continue;
        for (const [k, l] of mine) others.set(k, [...(others.get(k) ?? []), { held: l.held, want: l.want }]);
      }
      assert.ok(demands.length > 0);
      const settled = decide(others);
      const mine = this.leases.get(gateway) ?? new Map();
      for (const s of settled) mine.set(shareKey(s.route, s.label, s.kind), { held: s.held, want: s.want, expires: this.now + ttlS * 1000 });
      this.leases.set(gateway, mine);
      await Promise.resolve();
    };
    const done = this.#queue.then(run);
    this.#queue = done.catch(() => undefined);
    return done;
  }

  release(gateway: string): Promise<void> {
    this.leases.delete(gateway);
    return Promise.resolve();
  }

  held(key: string): number {
    let n = 0;
    for (const mine of this.leases.values()) n += mine.get(key)?.held ?? 0;
    return n;
  }
}

test('three gateways asking, ending requests and rebalancing in any order: the leases and the requests in flight never pass the limit', async () => {
  await fc.assert(
    fc.asyncProperty(
      fc.integer({ min: 1, max: 6 }),
      fc.array(fc.tuple(fc.constantFrom('ask', 'end', 'rebalance', 'tick', 'fail', 'heal'), fc.integer({ min: 0, max: 2 })), { minLength: 10, maxLength: 120 }),
      async (limit, steps) => {
        const store = new MemoryShares();
        let clock = 0;
        const settings = { credentialOrder: 'spread' as const, queueWaitMs: 60_000, queueMax: 1000 };
        const gateways = [0, 1, 2].map((g) => {
          const capacity = new Capacity(
            settings,
            () => true,
            {},
            () => clock,
            () => clock,
          );
          capacity.configure([{ name: 'r', capacity: [{ concurrency: limit, rate: null }] }], settings);
          const shares = new FleetShares(capacity, store, `g${g}`, 2_000, UNWATCHED, () => clock);
          // Sent while its lease held, and sent before a lease of it was swept (its holder was away past the TTL).
          const granted: number[] = [];
          const stale: number[] = [];
          return { capacity, shares, granted, stale };
        });
        store.onSwept = (g) => {
          const gw = gateways[Number(g.slice(1))] as (typeof gateways)[number];
          gw.stale.push(...gw.granted.splice(0));
        };
        const inFlight = () => gateways.reduce((n, g) => n + g.granted.length, 0);
        for (const [step, g] of steps) {
          const gw = gateways[g] as (typeof gateways)[number];
          if (step === 'ask') gw.capacity.ask('r', `k${g}`, false, (label) => label > 0 && gw.granted.push(label));
          else if (step === 'end' && gw.granted.length + gw.stale.length > 0) gw.capacity.release('r', (gw.stale.pop() ?? gw.granted.pop()) as number);
          else if (step === 'rebalance') gw.shares.now();
          else if (step === 'tick') {
            clock += 700;
            store.now = clock;
          } else if (step === 'fail') store.failing.add(`g${g}`);
          else if (step === 'heal') store.failing.delete(`g${g}`);
          await new Promise((r) => setImmediate(r));
          assert.ok(store.held(shareKey('r', 1, 'slots')) <= limit, 'the leases add up to more than the limit');
          // Requests sent on a lease that was then swept are its holder's past (a freeze, a cut): nothing sent since passes the limit.
          assert.ok(inFlight() <= limit, `${inFlight()} in flight for a limit of ${limit}`);
        }
        for (const g of gateways) await g.shares.stop();
      },
    ),
    {
      numRuns: 300,
      // Found once: a gateway whose lease was swept while it held room, asked again, must not send on it.
      examples: [
        [
          1,
          [
            ['ask', 2],
            ['tick', 0],
            ['tick', 0],
            ['ask', 0],
            ['ask', 0],
            ['ask', 0],
            ['tick', 0],
            ['end', 2],
            ['ask', 0],
            ['ask', 0],
            ['ask', 0],
            ['ask', 2],
          ],
        ],
      ],
    },
  );
});
