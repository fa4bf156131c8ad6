// No failure nobody sees (docs/operations.md, "Background tasks"): each
// background task that fails is logged once when its outage starts and
// once when it ends, counted every time, and listed in /readyz while it
// lasts; a bug is logged as one, at error.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { Outages, type Task } from '../../src/observe/outages.ts';
import { Clock, Leases } from '../../src/limits/leases.ts';
import { Settler, type DueRun, type RunStore } from '../../src/ledger/runs.ts';
import { withBackground, type Readiness } from '../../src/process/server.ts';
import { eventually } from '../support/deadline.ts';

/** A logger that keeps every line, and counts per task. */
function watched() {
  const lines: Array<{ level: string; msg: string; fields: Record<string, unknown> }> = [];
  const at = (level: string) => (fields: object, msg: string) => void lines.push({ level, msg, fields: fields as Record<string, unknown> });
  const counted = new Map<Task, number>();
  const outages = new Outages({ warn: at('warn'), error: at('error'), info: at('info') }, (task) => counted.set(task, (counted.get(task) ?? 0) + 1));
  return { lines, counted, outages };
}

const READY: Readiness = { ready: true, draining: false, keys: 1 };

test('an outage is logged when it starts and when it ends, not at each failure; each failure is counted; /readyz lists it while it lasts', () => {
  const { lines, counted, outages } = watched();
  const w = outages.watch('lease_renewal');
  w.ok();
  assert.equal(lines.length, 0, 'a success with no outage says nothing');
  assert.equal(withBackground(READY, outages), READY, 'nothing failing: readiness unchanged');
  for (let i = 0; i < 5; i++) w.failed(new Error(`connect ECONNREFUSED (attempt ${i})`));
  assert.deepEqual(
    lines.map((l) => [l.level, l.fields.task]),
    [['warn', 'lease_renewal']],
  );
  assert.equal(counted.get('lease_renewal'), 5);
  const r = withBackground(READY, outages);
  assert.equal(r.ready, true, 'still serving');
  assert.equal(r.failing?.length, 1);
  assert.equal(r.failing?.[0]?.task, 'lease_renewal');
  assert.equal(r.failing?.[0]?.failures, 5);
  assert.match(r.failing?.[0]?.error ?? '', /attempt 4/);
  w.ok();
  w.ok();
  assert.deepEqual(
    lines.map((l) => [l.level, l.msg]),
    [
      ['warn', lines[0]?.msg],
      ['info', 'background task working again'],
    ],
  );
  assert.equal(lines[1]?.fields.failures, 5);
  assert.equal(withBackground(READY, outages).failing, undefined);
});

test('a bug in a background task is logged at error with its stack, not taken for an outage of the store', () => {
  const { lines, outages } = watched();
  outages.watch('alert_check').failed(new TypeError("Cannot read properties of undefined (reading 'id')"));
  assert.equal(lines[0]?.level, 'error');
  assert.ok(lines[0]?.fields.err instanceof TypeError);
  outages.watch('usage_read').failed(new Error('timeout'));
  assert.equal(lines[1]?.level, 'warn');
});

test("a lease renewal and a lease claim that fail are seen; a claim's bug still fails closed", { timeout: 10_000 }, async () => {
  const { lines, counted, outages } = watched();
  let up = false;
  const store = {
    claim: async () => {
      if (!up) throw new TypeError('claim: a bug');
      return { got: 1, now: Date.now() };
    },
    renew: async () => {
      if (!up) throw new Error('connect ECONNREFUSED');
      return { now: Date.now(), lost: 0 };
    },
    release: async () => undefined,
  };
  const leases = new Leases(store, 'g1', new Clock(), () => 1, 30, null, { renewal: outages.watch('lease_renewal'), claim: outages.watch('lease_claim') });
  await leases.start(20);
  const took = leases.take('k', 'quota', '2026-11-29', 10, 1);
  assert.equal(took.kind, 'claiming');
  await (took.kind === 'claiming' ? took.claimed : null);
  assert.equal(leases.take('k', 'quota', '2026-11-29', 10, 1).kind, 'unreachable', 'a failed claim refuses more, whatever the cause');
  await eventually(() => (counted.get('lease_renewal') ?? 0) >= 3, 5_000, 'renewals failed and counted');
  assert.deepEqual(
    lines.filter((l) => l.fields.task === 'lease_renewal').map((l) => l.level),
    ['warn'],
    'said once',
  );
  assert.equal(lines.find((l) => l.fields.task === 'lease_claim')?.level, 'error');
  up = true;
  await eventually(() => lines.some((l) => l.fields.task === 'lease_renewal' && l.level === 'info'), 5_000, 'the renewal working again is said');
  await leases.stop();
});

function due(n: number): DueRun[] {
  return Array.from({ length: n }, (_, i) => ({
    id: `run${i}`,
    keyId: 'k',
    route: 'scraper',
    day: '2026-11-29',
    booked: 1,
    path: `/v2/actor-runs/run${i}`,
    at: Date.now(),
    attempts: 0,
  }));
}

function runStore(dueRuns: RunStore['dueRuns']): RunStore {
  return { dueRuns, settleRun: async () => true, deferRun: async () => undefined, dropRun: async () => true } as unknown as RunStore;
}

test('a run settler round is seen failing when the store does not answer, and when the platform answers none of the runs asked about', async () => {
  const { lines, counted, outages } = watched();
  let storeUp = false;
  let platformUp = false;
  const settler = new Settler({
    store: runStore(async () => {
      if (!storeUp) throw new Error('the ledger did not answer');
      return due(3);
    }),
    gateway: 'g1',
    ask: async () => (platformUp ? { run: { status: 'RUNNING', usd: null } } : { problem: 'the platform did not answer (ECONNREFUSED)' }) as never,
    max: 100,
    settled: () => undefined,
    failed: () => undefined,
    gaveUp: () => undefined,
    watch: outages.watch('run_settling'),
  });
  await settler.round();
  assert.equal(counted.get('run_settling'), 1);
  assert.match(String(outages.failing()[0]?.error), /ledger did not answer/);
  storeUp = true;
  await settler.round();
  assert.equal(counted.get('run_settling'), 2, 'three runs asked, none answered: the platform is away');
  assert.match(String(outages.failing()[0]?.error), /no run of 3 asked about was answered: the platform did not answer/);
  platformUp = true;
  await settler.round();
  assert.deepEqual(outages.failing(), [], 'the platform answered (the runs still run): the outage is over');
  assert.deepEqual(
    lines.map((l) => l.level),
    ['warn', 'info'],
  );
  await settler.stop();
});

test('alert checks that keep failing are seen after three in a row; one that passes ends it', { timeout: 10_000 }, async () => {
  const { Alerts } = await import('../../src/alerts/alerts.ts');
  const { policyOf } = await import('../../src/limits/policy.ts');
  const { lines, counted, outages } = watched();
  let up = false;
  const alerts = new Alerts({
    store: {
      claimAlert: async () => {
        if (!up) throw new Error('database is locked');
        return false;
      },
    } as never,
    use: () => ({ requests: () => 9, cost: () => 0 }),
    fire: () => undefined,
    unitOf: () => 'usd',
    watch: outages.watch('alert_check'),
  });
  const policy = policyOf({ quota: '10/day' });
  assert.ok(policy !== null);
  alerts.touched({ id: 'k', name: 'k' }, policy);
  await eventually(() => (counted.get('alert_check') ?? 0) >= 1, 5_000, 'the third failed check in a row is seen');
  assert.deepEqual(
    lines.map((l) => l.level),
    ['warn'],
  );
  up = true;
  await eventually(() => outages.failing().length === 0, 8_000, 'a check that passes ends it');
  assert.equal(lines.at(-1)?.msg, 'background task working again');
  alerts.stop();
});

test("a key's figures read in the background (a refusal's, in a fleet) that fail are seen", async () => {
  const { StoreView } = await import('../../src/views/key-status.ts');
  const { counted, outages } = watched();
  let up = false;
  const view = new StoreView(
    {
      rows: async () => {
        if (!up) throw new Error('canceling statement due to statement timeout');
        return [];
      },
    },
    null,
    0,
    1_000,
    outages.watch('usage_read'),
  );
  assert.equal(view.cached('k', Date.now()), null);
  await eventually(() => counted.get('usage_read') === 1, 5_000, 'the failed read counted');
  up = true;
  view.cached('k', Date.now());
  await eventually(() => outages.failing().length === 0, 5_000, 'the next read ends it');
});
