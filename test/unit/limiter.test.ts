// Admission's arithmetic (docs/limits.md): reservations, their settlement,
// the budget's estimate, and the numbers a refusal reports.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { decided, Limiter, type Admission, type PeriodUse, type Refused, type Verdict } from '../../src/limits/limiter.ts';
import type { Limits } from '../../src/keys/limits.ts';
import { policyOf } from '../../src/limits/policy.ts';

/** Period totals as a ledger would keep them, counted by hand. */
class Totals implements PeriodUse {
  requestsBy = new Map<string, number>();
  costBy = new Map<string, number>();
  requests(keyId: string): number {
    return this.requestsBy.get(keyId) ?? 0;
  }
  cost(keyId: string, route: string): number {
    return this.costBy.get(`${keyId}/${route}`) ?? 0;
  }
  count(keyId: string, route: string, cost: number): void {
    this.requestsBy.set(keyId, this.requests(keyId) + 1);
    this.costBy.set(`${keyId}/${route}`, this.cost(keyId, route) + cost);
  }
}

const policy = (l: Limits) => policyOf(l) as NonNullable<ReturnType<typeof policyOf>>;
const admitted = (r: Verdict): Admission => {
  assert.ok(r.kind === 'admitted', `refused: ${JSON.stringify(r)}`);
  return r;
};
const refused = (r: Verdict): Refused => {
  assert.ok(r.kind === 'refused', 'admitted, or not decided');
  return r;
};

/** A gateway's leases (of three live) on a store that grants each claim at least `got`, whatever is left. */
async function grantingLeases(got: number) {
  const { Leases, Clock } = await import('../../src/limits/leases.ts');
  const store = {
    claim: async (_g: string, _l: unknown, want: { least: number }) => ({ got: Math.max(want.least, got), now: Date.now() }),
    renew: async () => ({ now: Date.now(), lost: 0 }),
    release: async () => undefined,
  };
  return new Leases(store, 'g1', new Clock(), () => 3, 30);
}

test("RateLimit fields are the key's own whole numbers when a fleet shares a burst; a budget gives no request count", () => {
  const limiter = new Limiter(new Totals());
  const p = policy({ rate: '10/h', burst: 10 });
  const now = Date.now();
  let r: Verdict = admitted(limiter.admit('k', p, 'seo', now, 3));
  for (let i = 0; i < 5 && r.kind === 'admitted'; i++) r = limiter.admit('k', p, 'seo', now, 3);
  const no = refused(r);
  assert.equal(no.code, 'rate_limited');
  assert.equal(no.limit, 10, "the key's rate, not this gateway's third of it");
  assert.equal(no.policy, '10;w=3600;burst=10');
  const quota = new Limiter(new Totals());
  const q = policy({ quota: '1/day', budgets: { seo: '0/day' } });
  const day = refused(quota.admit('k', q, 'seo', now));
  assert.equal(day.code, 'budget_exceeded');
  assert.deepEqual([day.limit, day.remaining, day.policy], [null, null, null]);
  admitted(quota.admit('k', policy({ quota: '1/day' }), 'scraper', now));
  const over = refused(quota.admit('k', policy({ quota: '1/day' }), 'scraper', now));
  assert.deepEqual([over.code, over.limit, over.remaining, over.policy], ['quota_exceeded', 1, 0, '1;w=86400']);
});

test('a quota counts what is in flight; a request that never reached the upstream gives its unit back', () => {
  const totals = new Totals();
  const limiter = new Limiter(totals);
  const p = policy({ quota: '2/day' });
  const now = Date.now();
  const a = admitted(limiter.admit('k', p, 'seo', now));
  const b = admitted(limiter.admit('k', p, 'seo', now));
  assert.equal(refused(limiter.admit('k', p, 'seo', now)).code, 'quota_exceeded', 'two in flight fill a quota of two');
  a.done(false, 0); // never reached: not counted, unit back
  const c = admitted(limiter.admit('k', p, 'seo', now));
  totals.count('k', 'seo', 0);
  b.done(true, 0);
  b.done(true, 0); // once, whatever calls it
  totals.count('k', 'seo', 0);
  c.done(true, 0);
  assert.equal(refused(limiter.admit('k', p, 'seo', now)).code, 'quota_exceeded');
});

test("a budget reserves the key's learnt cost per call, then the route's, then 0; never below the route's dearest call of the period; a call reporting nothing teaches nothing", () => {
  const totals = new Totals();
  const limiter = new Limiter(totals);
  const p = policy({ budgets: { seo: '1/day' } });
  const now = Date.now();
  assert.equal(limiter.estimate('k', 'seo'), 0, 'nothing seen yet');
  const first = admitted(limiter.admit('k', p, 'seo', now));
  totals.count('k', 'seo', 0.3);
  first.done(true, 0.3);
  assert.equal(limiter.estimate('k', 'seo'), 0.3);
  assert.equal(limiter.estimate('other', 'seo'), 0.3, "another key starts from the route's");
  // 0.3 spent; admitted while spent + reserved < 1: at 0.3, 0.6 and 0.9 reserved-and-spent, then 1.2.
  const held = [admitted(limiter.admit('k', p, 'seo', now)), admitted(limiter.admit('k', p, 'seo', now)), admitted(limiter.admit('k', p, 'seo', now))];
  assert.equal(refused(limiter.admit('k', p, 'seo', now)).code, 'budget_exceeded');
  // A call that reports more raises the estimate to it: the dearest call of the period is its floor.
  totals.count('k', 'seo', 0.5);
  held[0]?.done(true, 0.5);
  assert.equal(limiter.estimate('k', 'seo'), 0.5);
  // Cheap calls, of this key or another, never talk it down; calls that report nothing teach nothing.
  held[1]?.done(true, 0.001);
  held[2]?.done(true, null);
  for (let i = 0; i < 30; i++) admitted(limiter.admit('cheap', policy({ budgets: { seo: '100/day' } }), 'seo', now)).done(true, i % 2 === 0 ? 0.001 : null);
  assert.equal(limiter.estimate('k', 'seo'), 0.5);
  assert.equal(limiter.estimate('fresh', 'seo'), 0.5, "a key never seen reserves at least the route's dearest call");
  // The next day starts from the learnt average, not yesterday's dearest call.
  assert.ok(limiter.estimate('k', 'seo', 'day', now + 86_400_000) < 0.5);
});

test("a key's first budgeted call on a route holds up only that key's calls, and only until its cost is known or PROBE_MS passed", async () => {
  const totals = new Totals();
  const limiter = new Limiter(totals);
  const p = policy({ budgets: { seo: '1/day' } });
  const now = Date.now();
  const aliceFirst = admitted(limiter.admit('alice', p, 'seo', now));
  // Bob's first call is his own probe: it does not wait for alice's.
  const bobFirst = admitted(limiter.admit('bob', p, 'seo', now));
  // Alice's second call waits for her first one's cost.
  const aliceSecond = limiter.admit('alice', p, 'seo', now);
  assert.ok(aliceSecond.kind === 'pending', "alice's overlapping call waits for her first one's cost");
  let settled = false;
  void aliceSecond.decided.then(() => (settled = true));
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(settled, false);
  totals.count('alice', 'seo', 0.4);
  aliceFirst.done(true, 0.4);
  const second = admitted(await aliceSecond.decided);
  assert.equal(limiter.estimate('alice', 'seo'), 0.4, 'it reserved what the first one cost');
  second.done(false, 0);
  bobFirst.done(false, 0);
});

test("a first budgeted call that never ends holds its key's next calls for PROBE_MS at most", { timeout: 10_000 }, async () => {
  const { PROBE_MS } = await import('../../src/limits/limiter.ts');
  const limiter = new Limiter(new Totals());
  const p = policy({ budgets: { speech: '100/day' } });
  const stream = admitted(limiter.admit('carol', p, 'speech', Date.now()));
  const t = performance.now();
  // The probe's own timer does not hold the process (it is unref'd): this test's wait does.
  const alive = setTimeout(() => undefined, PROBE_MS * 3);
  const next = admitted(await decided(limiter.admit('carol', p, 'speech', Date.now())));
  clearTimeout(alive);
  const waited = performance.now() - t;
  assert.ok(waited >= PROBE_MS - 50 && waited < PROBE_MS + 1_000, `waited ${waited.toFixed(0)} ms for a stream that had not ended`);
  next.done(false, 0);
  stream.done(false, 0);
});

test("a first budgeted call whose cost arrives at its head lets its key's waiting calls go on at once, reserving that cost", async () => {
  const limiter = new Limiter(new Totals());
  const p = policy({ budgets: { speech: '100/day' } });
  const first = admitted(limiter.admit('dora', p, 'speech', Date.now()));
  const waiting = limiter.admit('dora', p, 'speech', Date.now());
  assert.ok(waiting.kind === 'pending');
  const t = performance.now();
  first.costKnown?.(12);
  const next = admitted(await waiting.decided);
  assert.ok(performance.now() - t < 500, 'not held until the first call ends');
  assert.equal(limiter.estimate('dora', 'speech'), 12);
  next.done(false, 0);
  first.done(true, 12);
});

test("a settled route's run in a fleet is refused once the fleet's figures read for it say the budget is spent, whatever this gateway's lease still holds", async () => {
  // A store that grants every claim whole: the lease holds more than the budget has left.
  const leases = await grantingLeases(0.6);
  // The fleet's figures, as the store last said: 0.7 spent of a 1 USD budget, then all of it.
  let fleetSpent = 0.7;
  let reads = 0;
  const fleet = {
    cached: () => ({ requests: () => 0, cost: () => fleetSpent }),
    fresh: async () => {
      reads++;
    },
  };
  const limiter = new Limiter(new Totals(), { leases, billedLater: new Set(['scraper']), fleet });
  const p = policy({ budgets: { scraper: '1/day' } });
  const first = await decided(limiter.admit('k', p, 'scraper', Date.now(), 3, { asked: 0.5 }));
  assert.ok(!('code' in first), 'admitted while the fleet has 0.3 left');
  assert.ok(Math.abs((first.cap ?? -1) - 0.3) < 1e-9, `capped at what the fleet has left (${first.cap})`);
  first.done(true, 0.1);
  fleetSpent = 1;
  const second = await decided(limiter.admit('k', p, 'scraper', Date.now(), 3, { asked: null }));
  assert.ok('code' in second, 'refused: the fleet spent the budget, though this lease holds 0.5 more');
  assert.equal(second.code, 'budget_exceeded');
  assert.equal(second.detail?.used, 1);
  assert.equal(reads, 2, 'the figures were read for each run');
});

test('a budget spent to the micro-dollar is spent, in whatever order its costs were added (one machine and a fleet)', async () => {
  const fc = (await import('fast-check')).default;
  // Costs in whole micro-dollars that add up to the budget, or to one micro-dollar short of it,
  // summed as the ledger sums them: in binary floating point, in the order given.
  const spends = fc
    .tuple(fc.integer({ min: 1, max: 5_000_000 }), fc.array(fc.integer({ min: 1, max: 100 }), { minLength: 1, maxLength: 12 }), fc.boolean())
    .map(([budget, weights, short]) => {
      const total = weights.reduce((a, b) => a + b, 0);
      const parts = weights.map((w) => Math.floor((budget * w) / total));
      parts[0] = (parts[0] as number) + budget - parts.reduce((a, b) => a + b, 0) - (short ? 1 : 0);
      return { budget, parts, short };
    })
    .filter(({ parts }) => parts.every((p) => p >= 0));
  await fc.assert(
    fc.asyncProperty(spends, async ({ budget, parts, short }) => {
      const amount = budget / 1e6;
      const spent = parts.reduce((a, p) => a + p / 1e6, 0);
      const p = policy({ budgets: { scraper: `${amount}/day` } });
      // One machine: the ledger's totals.
      const totals = new Totals();
      for (const part of parts) totals.count('k', 'scraper', part / 1e6);
      const alone = new Limiter(totals).admit('k', p, 'scraper', Date.now());
      // A fleet: the figures read for a settled route's run; a lease that would grant it.
      const fleet = new Limiter(new Totals(), {
        leases: await grantingLeases(amount),
        billedLater: new Set(['scraper']),
        fleet: { cached: () => ({ requests: () => 0, cost: () => spent }), fresh: async () => undefined },
      });
      const inFleet = await decided(fleet.admit('k', p, 'scraper', Date.now(), 3, { asked: 1e-6 }));
      for (const [where, r] of [
        ['one machine', alone],
        ['a fleet', inFleet],
      ] as const) {
        assert.ok(r.kind !== 'pending');
        if (short) {
          assert.ok(!('code' in r), `${where}: a micro-dollar left (${spent} of ${amount}) is admitted`);
          r.done(false, 0);
        } else assert.ok('code' in r && r.code === 'budget_exceeded', `${where}: ${spent} of ${amount} is spent`);
      }
    }),
    { numRuns: 300 },
  );
  // The order that admitted a fifth run against a spent 1 USD budget.
  const totals = new Totals();
  for (const c of [0.3, 0.3, 0.3, 0.1]) totals.count('k', 'scraper', c);
  assert.equal(totals.cost('k', 'scraper') < 1, true, 'the sum is a bit under 1 in this order');
  assert.equal(refused(new Limiter(totals).admit('k', policy({ budgets: { scraper: '1/day' } }), 'scraper', Date.now())).code, 'budget_exceeded');
});

test("a key's first budgeted call keeps its admission's reservation: the probe adds its end, it drops nothing", () => {
  const limiter = new Limiter(new Totals());
  const p = policy({ budgets: { speech: '100/day' } });
  const first = admitted(limiter.admit('erin', p, 'speech', Date.now()));
  assert.equal(typeof first.costKnown, 'function', 'it is the probe');
  // Nothing learnt yet: it reserves 0, and says so (undefined would read as "no budget here").
  assert.equal(first.reserved, 0);
  first.done(true, 3);
  const next = admitted(limiter.admit('erin', p, 'speech', Date.now()));
  assert.equal(next.reserved, 3);
  next.done(false, null);
});

test('a take whose claims keep being taken by others answers 503 admission_unavailable after 50 claims, never a 429, and holds nothing', async () => {
  const { InFlight } = await import('../../src/limits/leases.ts');
  const held = new InFlight();
  let claims = 0;
  // An allowance whose every claim is answered, and whose every answer is gone by the time the request asks again.
  const contended = {
    at: (now: number) => now,
    periodKey: () => '2026-11-29',
    reserved: (k: string, kind: string) => held.reserved(k, kind),
    take: () => (claims++, { kind: 'claiming' as const, claimed: Promise.resolve() }),
    takeUpTo: () => (claims++, { kind: 'claiming' as const, claimed: Promise.resolve() }),
    reconcile: (k: string, kind: string, period: string, reserved: number, used: number) => held.reconcile(k, kind, period, reserved, used),
  };
  const limiter = new Limiter(new Totals(), { leases: contended, waitMs: 1_000 });
  const p = policy({ quota: '10/day', concurrency: 1 });
  const r = decided(limiter.admit('fay', p, 'seo', Date.now()));
  const d = await r;
  assert.equal(d.kind, 'undecided');
  assert.equal(d.kind === 'undecided' && d.code, 'admission_unavailable');
  assert.equal(claims, 51, 'the first take and 50 claims waited for');
  const [quota, slots] = limiter.status('fay', p, Date.now());
  assert.equal(quota?.used, 0, 'no quota unit held');
  assert.equal(slots?.used, 0, 'no concurrency slot held');
});
