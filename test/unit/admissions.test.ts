// The worker–primary exchange of admissions (docs/limits.md, "One key, one
// limit") driven without processes: a worker that stops waiting cancels,
// and whatever the primary decides for it later is given back at once.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import type { Worker } from 'node:cluster';
import { test } from 'node:test';
import { askPrimary, serveAdmissions, workerWaitMs } from '../../src/limits/admissions.ts';
import { decided, Limiter, PROBE_WAIT_MS, type PeriodUse } from '../../src/limits/limiter.ts';
import { policyOf } from '../../src/limits/policy.ts';
import type { Principal } from '../../src/keys/keyset.ts';

const NONE: PeriodUse = { requests: () => 0, cost: () => 0 };

/** One worker and its primary over an in-memory channel; `deliver` false holds the primary's answers (a frozen primary). */
function pair(limiter: Limiter, answerMs: number) {
  const cluster = new EventEmitter();
  const toWorker = new EventEmitter();
  const held: unknown[] = [];
  let deliver = true;
  let connected = true;
  const worker = {
    send: (m: unknown) => toWorker.emit('message', m),
    isConnected: () => connected,
  } as unknown as Worker;
  serveAdmissions(
    cluster,
    limiter,
    () => 1,
    () => undefined,
  );
  const admit = askPrimary(
    (m) => {
      if (deliver) cluster.emit('message', worker, m);
      else held.push(m);
    },
    (listener) => toWorker.on('message', listener),
    answerMs,
  );
  return {
    admit,
    freeze: () => (deliver = false),
    thaw: () => {
      deliver = true;
      for (const m of held.splice(0)) cluster.emit('message', worker, m);
    },
    exit: () => {
      connected = false;
      cluster.emit('exit', worker);
    },
  };
}

const principal = (limits: Record<string, unknown>): Principal => ({ id: 'k', name: 'k', limits }) as unknown as Principal;

test('a worker that stops waiting answers admission_unavailable, and what the primary admits for it later is given back', async () => {
  const limiter = new Limiter(NONE);
  const limits = { concurrency: 1 };
  const policy = policyOf(limits) as NonNullable<ReturnType<typeof policyOf>>;
  const p = pair(limiter, 50);
  p.freeze();
  const late = await decided(p.admit(principal(limits), policy, 'seo', Date.now(), null));
  assert.deepEqual(late, { kind: 'undecided', code: 'admission_unavailable', retryAfter: 1 });
  p.thaw();
  // The primary admitted it once thawed, then took the cancellation: the slot is free.
  const next = await decided(p.admit(principal(limits), policy, 'seo', Date.now(), null));
  assert.ok(!('code' in next), JSON.stringify(next));
  assert.equal(limiter.status('k', policy, Date.now()).find((l) => l.kind === 'concurrency')?.used, 1);
  next.done(true, null);
  assert.equal(limiter.status('k', policy, Date.now()).find((l) => l.kind === 'concurrency')?.used, 0);
});

test("a paid start's cap travels from the primary to the worker, and a worker that exits gives its slots back", async () => {
  const limiter = new Limiter(NONE, { billedLater: new Set(['scraper']) });
  const limits = { budgets: { scraper: '1/day' }, concurrency: 5 };
  const policy = policyOf(limits) as NonNullable<ReturnType<typeof policyOf>>;
  const p = pair(limiter, 1_000);
  const a = await decided(p.admit(principal(limits), policy, 'scraper', Date.now(), { asked: 0.25 }));
  assert.ok(!('code' in a));
  assert.deepEqual({ cap: a.cap, reserved: a.reserved }, { cap: 0.25, reserved: 0.25 });
  const b = await decided(p.admit(principal(limits), policy, 'scraper', Date.now(), { asked: null }));
  assert.ok(!('code' in b));
  assert.equal(b.cap, 0.1, 'a tenth of the budget');
  p.exit();
  const status = limiter.status('k', policy, Date.now());
  assert.equal(status.find((l) => l.kind === 'concurrency')?.used, 0, 'slots back');
});

test("a worker's wait for its primary follows KEYWARD_ADMISSION_WAIT: past the longest the primary itself may wait", () => {
  // The primary waits for a key's earlier calls' cost, then the store at most twice.
  for (const wait of [1, 250, 2_000, 10_000]) assert.ok(workerWaitMs(wait) > PROBE_WAIT_MS + 2 * wait, `${wait} ms`);
  assert.equal(workerWaitMs(250), 5_000, 'the default wait');
  assert.ok(workerWaitMs(10_000) > workerWaitMs(250));
});
