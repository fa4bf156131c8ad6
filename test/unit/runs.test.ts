// Scraper runs (docs/limits.md, "Scraper runs"): which requests start a run,
// the run object read at any chunk boundary, the cap on a query, and the
// settler's decisions, driven without sockets.
import { join } from 'node:path';
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { askedRunCap, usd, withRunCap } from '../../src/request/query.ts';
import { scraperCall } from '../../src/request/scraper-calls.ts';
import { runOf, Settler, type DueRun, type PendingRun, type RunAnswer, type RunStore } from '../../src/ledger/runs.ts';
import { leadingId, RunReader } from '../../src/request/cost.ts';
import { usageRow } from '../support/rows.ts';

test('paid starts by path, under any prefix and however spelt; nothing else', () => {
  const kind = (method: string, path: string): string | null => {
    const c = scraperCall(method, path);
    return c === null ? null : c.kind === 'start' ? `start ${c.prefix}` : c.kind;
  };
  assert.equal(kind('POST', '/v2/acts/apify~web-scraper/runs'), 'start /v2');
  assert.equal(kind('POST', '/acts/x/runs'), 'start ');
  assert.equal(kind('POST', '/v2/actor-tasks/t1/runs/'), 'start /v2');
  assert.equal(kind('POST', '/api/v2/acts/x/runs'), 'start /api/v2');
  // Spellings a lenient router upstream could read as a run-start.
  for (const p of [
    '/v2/ACTS/x/RUNS',
    '/v2/%61cts/x/runs',
    '/v2/acts/x/runs//',
    '/v2//acts/x/runs',
    '/v2/acts/x/runs;jsessionid=1',
    '/v2\\acts\\x\\runs',
    '/v2/acts%2Fx%2Fruns',
  ])
    assert.equal(kind('POST', p), 'start /v2', p);
  assert.equal(kind('post', '/v2/acts/x/runs'), 'start /v2');
  // Runs set going again answer with the run object, under the run's own path.
  for (const p of ['/v2/actor-runs/abc/resurrect', '/v2/actor-runs/abc/reboot', '/v2/Actor-Runs/abc/METAMORPH', '/v2/acts/x/runs/abc/resurrect'])
    assert.equal(kind('POST', p), 'start /v2', p);
  for (const p of ['/v2/acts/x/run-sync', '/v2/actor-tasks/x/run-sync-get-dataset-items', '/v2/ACTS/x/Run-Sync/']) assert.equal(kind('POST', p), 'sync', p);
  // Spend out of sight: schedules, webhooks, builds, created or changed.
  for (const [m, p] of [
    ['POST', '/v2/schedules'],
    ['PUT', '/v2/schedules/s1'],
    ['POST', '/v2/webhooks'],
    ['PATCH', '/v2/Webhooks/w1'],
    ['POST', '/v2/acts/x/builds'],
    ['POST', '/v2/%73chedules'],
  ])
    assert.equal(kind(m as string, p as string), 'later', `${m} ${p}`);
  // An actor or task that happens to be called so is an id, not the resource.
  assert.equal(kind('POST', '/v2/acts/builds/runs'), 'start /v2');
  for (const p of ['/v2/acts/x/runs/last', '/v2/acts/runs', '/v2/actor-runs/abc', '/v2/acts/x/runs/abc/abort', '/v2/datasets', '/v2/acts/x/run-sync/more'])
    assert.equal(kind('POST', p), null, p);
  for (const m of ['GET', 'DELETE', 'HEAD']) assert.equal(kind(m, '/v2/acts/x/runs'), null, m);
  assert.equal(kind('GET', '/v2/schedules'), null);
});

test('a run object read whole at every chunk boundary; anything else is no run', () => {
  const body = Buffer.from(JSON.stringify({ data: { id: 'HG7ML7M8z78YcAPEB', actId: 'a', status: 'READY', usageTotalUsd: 0, nested: { id: 'no' } } }));
  fc.assert(
    fc.property(fc.array(fc.integer({ min: 0, max: body.length }), { maxLength: 6 }), (cuts) => {
      const r = new RunReader();
      const at = [...new Set([0, ...cuts.sort((a, b) => a - b), body.length])];
      for (let i = 1; i < at.length; i++) r.push(body.subarray(at[i - 1], at[i]));
      r.end();
      assert.deepEqual(r.run, { id: 'HG7ML7M8z78YcAPEB' });
    }),
  );
  // The platform's shape read from the bytes; blanks between tokens; any other order parsed whole.
  assert.equal(leadingId(Buffer.from('{"data":{"id":"abc","status":"READY"}}')), 'abc');
  assert.equal(leadingId(Buffer.from(' {\n "data" : {\t"id" :"a_b-C9"}}')), 'a_b-C9');
  for (const b of [
    '{"data":{"status":"READY","id":"abc"}}',
    '{"data":{"id":""}}',
    '{"data":{"id":"a/b"}}',
    '{"datum":{"id":"abc"}}',
    '{"data":{"id":"abc',
    `{"data":{"id":"${'a'.repeat(70)}"}}`,
  ])
    assert.equal(leadingId(Buffer.from(b)), null, b);
  const reordered = new RunReader();
  reordered.push(Buffer.from('{"data":{"status":"READY","nested":{"id":"no"},"id":"yes1"}}'));
  reordered.end();
  assert.deepEqual(reordered.run, { id: 'yes1' });
  for (const bad of [
    null,
    [],
    { data: null },
    { data: { id: 5, status: 'READY' } },
    { data: { id: '../x', status: 'READY' } },
    { data: { id: 'a', status: 3 } },
  ])
    assert.equal(runOf(bad), null, JSON.stringify(bad));
  assert.deepEqual(runOf({ data: { id: 'a', status: 'SUCCEEDED', usageTotalUsd: -1 } }), { id: 'a', status: 'SUCCEEDED', usd: null });
  const big = new RunReader();
  big.push(Buffer.alloc(300 * 1024, 0x20));
  big.push(Buffer.from('{"data":{"id":"a","status":"READY"}}'));
  big.end();
  assert.equal(big.run, null, 'a body past the bound is no run object');
  // A body cut short still names its run when the id came whole (the run was started: it is asked about).
  const cut = new RunReader();
  cut.push(Buffer.from('{"data":{"id":"a","sta'));
  cut.end();
  assert.deepEqual(cut.run, { id: 'a' });
  const broken = new RunReader();
  broken.push(Buffer.from('{"data":{"status":"READY","id":"a'));
  broken.end();
  assert.equal(broken.run, null);
});

test('the cap: appended at the reservation, the rest byte for byte; a lower plain cap of the client kept; every other spelling replaced', () => {
  assert.equal(withRunCap('', 1), 'maxTotalChargeUsd=1');
  assert.equal(withRunCap('build=latest&x=%20', 0.7), 'build=latest&x=%20&maxTotalChargeUsd=0.7');
  assert.equal(withRunCap('maxTotalChargeUsd=0.05&b=1', 0.7), 'maxTotalChargeUsd=0.05&b=1');
  assert.equal(withRunCap('maxTotalChargeUsd=0.05&b=1', 0.05), 'maxTotalChargeUsd=0.05&b=1');
  assert.equal(withRunCap('a=1&maxTotalChargeUsd=5&b=2', 0.7), 'a=1&b=2&maxTotalChargeUsd=0.7');
  // Twice, a spelling that is no plain number, another case, brackets, encodings, `;`, blanks: all removed, ours appended.
  for (const q of [
    'maxTotalChargeUsd=0.1&maxTotalChargeUsd=0.2',
    'maxTotalChargeUsd=1e-3',
    'MAXTOTALCHARGEUSD=0.1&maxTotalChargeUsd%5B%5D=0.1',
    'maxTotalChargeUsd[]=0.01',
    'maxTotalChargeUsd%5Ba%5D=0.01',
    'maxTotalChargeUsd%00=0.01',
    '+maxTotalChargeUsd=0.01',
    'a=1;maxTotalChargeUsd=0.01',
    'maxTotalChargeUsd=0.01&maxtotalchargeusd=99999',
    '%6DaxTotalChargeUsd=0.01',
  ]) {
    assert.equal(withRunCap(q, 1).endsWith('maxTotalChargeUsd=1'), true, q);
    assert.equal(
      withRunCap(q, 1)
        .split('&')
        .filter((p) => /maxtotalchargeusd/i.test(decodeURIComponent(p.replace(/%00/g, '')))).length,
      1,
      q,
    );
    assert.equal(askedRunCap(q), null, q);
  }
  assert.equal(withRunCap('x=1&maxTotalChargeUsd[]=0.01&y=2', 1), 'x=1&y=2&maxTotalChargeUsd=1');
  assert.equal(askedRunCap('maxTotalChargeUsd=0.25&x=1'), 0.25);
  assert.equal(askedRunCap(''), null);
  assert.equal(usd(0.1 + 0.2), '0.3');
  assert.equal(usd(0.6999994), '0.699999');
  assert.equal(usd(0.7 - 1e-12), '0.7', 'floating-point dust is no fraction of a cent');
  assert.equal(usd(2), '2');
  assert.equal(usd(1234.5678919), '1234.567891');
  assert.equal(usd(-1), '0');
  fc.assert(
    fc.property(fc.double({ min: 0, max: 1e6, noNaN: true }), (v) => {
      const text = usd(v);
      assert.match(text, /^\d+(?:\.\d{1,6})?$/);
      assert.ok(Number(text) <= v + 1e-9 && Number(text) >= v - 1.000001e-6, `${v} → ${text}`);
    }),
  );
});

/** A store in memory, recording what the settler did. */
class Runs implements RunStore {
  readonly pending = new Map<string, DueRun & { nextAt: number; claimedUntil: number }>();
  readonly booked: Array<{ id: string; cost: number }> = [];
  readonly deferred: Array<{ id: string; attempts: number; waitMs: number }> = [];
  add(run: PendingRun): void {
    this.pending.set(run.id, { ...run, attempts: 0, nextAt: 0, claimedUntil: 0 });
  }
  dueRuns(_gateway: string, now: number, limit: number, forMs: number): Promise<DueRun[]> {
    const due = [...this.pending.values()].filter((r) => r.nextAt <= now && r.claimedUntil < now).slice(0, limit);
    for (const r of due) r.claimedUntil = now + forMs;
    return Promise.resolve(due.map((r) => ({ ...r })));
  }
  settleRun(run: PendingRun, cost: number): Promise<boolean> {
    if (!this.pending.delete(run.id)) return Promise.resolve(false);
    this.booked.push({ id: run.id, cost });
    return Promise.resolve(true);
  }
  deferRun(id: string, attempts: number, waitMs: number): Promise<void> {
    const r = this.pending.get(id);
    if (r !== undefined) this.pending.set(id, { ...r, attempts, nextAt: Date.now() + waitMs, claimedUntil: 0 });
    this.deferred.push({ id, attempts, waitMs });
    return Promise.resolve();
  }
  dropRun(id: string): Promise<boolean> {
    return Promise.resolve(this.pending.delete(id));
  }
  pendingRuns(): Promise<Array<{ keyId: string; route: string; day: string; runs: number }>> {
    return Promise.resolve([]);
  }
}

const run = (id: string, at = Date.now()): PendingRun => ({
  id,
  keyId: 'k',
  route: 'scraper',
  day: '2026-11-26',
  booked: 0.1,
  path: `/v2/actor-runs/${id}`,
  at,
});

test('the settler: books a run that ended, defers one running or unanswered with a growing wait, gives up one too old, refuses an implausible cost', async () => {
  const store = new Runs();
  const answers = new Map<string, RunAnswer>([
    ['done', { run: { id: 'done', status: 'SUCCEEDED', usd: 0.42 } }],
    ['running', { run: { id: 'running', status: 'RUNNING', usd: 0.01 } }],
    ['down', { problem: 'the upstream answered 503' }],
    ['old', { run: { id: 'old', status: 'RUNNING', usd: 0 } }],
    ['huge', { run: { id: 'huge', status: 'SUCCEEDED', usd: 1e9 } }],
    ['nocost', { run: { id: 'nocost', status: 'FAILED', usd: null } }],
  ]);
  for (const id of answers.keys()) store.add(run(id, id === 'old' ? Date.now() - 10_000 : Date.now()));
  const seen = { settled: [] as string[], failed: [] as string[], gaveUp: [] as string[] };
  const s = new Settler({
    store,
    gateway: 'g',
    ask: (r) => Promise.resolve(answers.get(r.id) ?? { problem: 'unknown' }),
    max: 10_000,
    settled: (r, cost) => seen.settled.push(`${r.id}=${cost}`),
    failed: (r, problem) => seen.failed.push(`${r.id}: ${problem}`),
    gaveUp: (r) => seen.gaveUp.push(r.id),
    concurrency: 10,
    giveUpMs: 5_000,
    backoff: { firstMs: 1_000, maxMs: 4_000 },
  });
  await s.round();
  assert.deepEqual(store.booked, [{ id: 'done', cost: 0.42 }]);
  assert.deepEqual(seen.settled, ['done=0.42']);
  assert.deepEqual(seen.gaveUp, ['old']);
  assert.deepEqual(seen.failed.sort(), [
    'down: the upstream answered 503',
    'huge: the run reported an implausible cost',
    'nocost: the run ended with no usageTotalUsd',
  ]);
  assert.deepEqual(store.deferred.map((d) => `${d.id}:${d.attempts}:${d.waitMs}`).sort(), ['down:1:1000', 'huge:1:1000', 'nocost:1:1000', 'running:1:1000']);
  // Nothing due until the wait passed: a second round asks nobody.
  const asked = store.deferred.length;
  await s.round();
  assert.equal(store.deferred.length, asked);
  // Due again: the wait doubles, up to its bound.
  for (const r of store.pending.values()) store.pending.set(r.id, { ...r, nextAt: 0 });
  await s.round();
  assert.deepEqual(
    store.deferred.slice(asked).map((d) => d.waitMs),
    [2_000, 2_000, 2_000, 2_000],
  );
  await s.stop();
  for (const r of store.pending.values()) store.pending.set(r.id, { ...r, nextAt: 0 });
  await s.round();
  assert.equal(store.deferred.length, asked + 4, 'no round after stop');
});

test('the settler: a run another gateway settled first is not booked again', async () => {
  const store = new Runs();
  store.add(run('twice'));
  const booked: string[] = [];
  const s = new Settler({
    store,
    gateway: 'g',
    // While this question is out, another gateway books the run.
    ask: async () => {
      await store.settleRun(run('twice'), 0.3);
      return { run: { id: 'twice', status: 'SUCCEEDED', usd: 0.3 } };
    },
    max: 10,
    settled: (r) => booked.push(r.id),
    failed: () => undefined,
    gaveUp: () => undefined,
  });
  await s.round();
  assert.deepEqual(store.booked, [{ id: 'twice', cost: 0.3 }]);
  assert.deepEqual(booked, [], 'the second settle found it gone');
  await s.stop();
});

test('a spooled batch carries its runs; one whose run breaks the rules is set aside, the others written', async () => {
  const { mkdtempSync, readFileSync, rmSync, writeFileSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { readSpool } = await import('../../src/ledger/spool.ts');
  const dir = mkdtempSync(join(tmpdir(), 'keyward-spool-runs-'));
  try {
    const prefix = join(dir, 'keys.json.usage-unwritten');
    const row = usageRow({ keyId: 'k', route: 'scraper', day: '2026-11-26', bytesIn: 2, bytesOut: 900, cost: 0.1 });
    const good = { ...run('good1'), at: 1_795_000_000_000 };
    const batches = [
      { gateway: 'g', seq: 1, rows: [row], runs: [good] },
      { gateway: 'g', seq: 2, rows: [row], runs: [{ ...good, id: '../../etc' }] },
      { gateway: 'g', seq: 3, rows: [row], runs: [{ ...good, id: 'neg', booked: -5 }] },
      { gateway: 'g', seq: 4, rows: [row], runs: [{ ...good, id: 'nopath', path: 'http://elsewhere/' }] },
    ];
    writeFileSync(`${prefix}.g.json`, JSON.stringify({ batches }));
    const kept = readSpool(prefix);
    assert.deepEqual(
      kept.batches.map((b) => b.seq),
      [1],
    );
    assert.deepEqual(kept.batches[0]?.runs, [good]);
    assert.equal(kept.setAside[0]?.batches, 3);
    assert.deepEqual([...(kept.setAside[0]?.reasons ?? [])].sort(), [
      'a run without a run id',
      'run neg: booked -5 is not a figure from 0 to 1000000000000',
      'run nopath: no path to ask',
    ]);
    assert.match(readFileSync(`${prefix}.g.json.set-aside`, 'utf8'), /etc/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
