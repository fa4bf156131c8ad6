// With KEYWARD_WORKERS > 1 a worker that waited 5 s for its primary dropped
// the request with `concurrency_limited` while the primary admitted it later
// and kept it: a frozen primary burnt a whole day's quota (100 refused, 0
// forwarded, `granted=100` after a restart), a key with `--concurrency 2`
// stayed refused until a restart, and a key whose calls waited for a slow
// first cost was refused for the day with "1.8 used of 1". Now the worker
// cancels what it stopped waiting for, the primary gives late admissions
// back at once, a silent primary is 503 `admission_unavailable`, and no
// call waits longer for a cost than the worker waits for its primary
// (docs/limits.md, "One key, one limit").
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { runCli, startCli } from '../support/cli.ts';
import { request, type Reply } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startUpstream, type MockUpstream } from '../support/upstream.ts';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';

interface Machine {
  base: string;
  primary: number;
  workers: number[];
  up: MockUpstream;
  token(name: string, ...flags: string[]): Promise<string>;
  call(token: string, path?: string, agent?: http.Agent): Promise<Reply>;
  /**
   * `n` connections opened now and kept: the primary hands new connections
   * to workers, so while it is frozen only requests on connections a worker
   * already holds reach a worker (and wait for the primary).
   */
  warm(n: number): Promise<http.Agent>;
  status(token: string): Promise<Array<{ kind: string; route?: string; used: number; remaining: number }>>;
  stop(): Promise<void>;
}

async function machine(workers: number, handler?: (req: IncomingMessage, res: ServerResponse) => void): Promise<Machine> {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-unit-'));
  const up = await startUpstream(handler);
  const env = {
    KEYWARD_WORKERS: String(workers),
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'me',
    KEYWARD_SEO_PASSWORD: 'pw',
    KEYWARD_USAGE_FLUSH: '200ms',
    // A frozen worker's idle-connection timer must not close the connections the test keeps.
    KEYWARD_KEEPALIVE_TIMEOUT: '60s',
  };
  // Keys made before the start: a worker learns a key from the file it watches.
  const tokens = new Map<string, string>();
  for (const [name, flags] of [
    ['quota', ['--quota', '100/day']],
    ['conc', ['--concurrency', '2']],
    ['budget', ['--budget', 'seo=1/day']],
    ['free', []],
  ] as const) {
    const r = await runCli(['keys', 'create', '--name', name, '--json', ...flags], env);
    assert.equal(r.code, 0, r.stderr);
    tokens.set(name, (JSON.parse(r.stdout) as { token: string }).token);
  }
  const serve = await startCli(['serve'], { ...env, KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: 'off' }, '"msg":"keyward listening"');
  const listening = (): Array<{ port: number; pid: number }> =>
    serve
      .output()
      .split('\n')
      .filter((l) => l.includes('"msg":"keyward listening"'))
      .map((l) => JSON.parse(l) as { port: number; pid: number });
  await eventually(() => listening().length === workers, 20_000, `${workers} workers listening`);
  const base = `http://127.0.0.1:${(listening()[0] as { port: number }).port}`;
  const call = (token: string, path = '/seo/v3/x', agent?: http.Agent): Promise<Reply> =>
    request(`${base}${path}`, { headers: { authorization: `Bearer ${token}` }, agent: agent ?? false, timeoutMs: 30_000 });
  return {
    base,
    primary: serve.child.pid as number,
    workers: listening().map((l) => l.pid),
    up,
    token: (name) => Promise.resolve(tokens.get(name) as string),
    call,
    warm: async (n) => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: n });
      const free = tokens.get('free') as string;
      await Promise.all(Array.from({ length: n }, () => call(free, '/seo/v3/warm', agent)));
      return agent;
    },
    status: async (token) => ((await call(token, '/keyward/key')).json() as { limits: Array<{ kind: string; used: number; remaining: number }> }).limits,
    stop: async () => {
      process.kill(serve.child.pid as number, 'SIGCONT');
      serve.child.kill('SIGTERM');
      await deadline(serve.done, 20_000, 'exit').catch(() => serve.child.kill('SIGKILL'));
      await up.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const codeOf = (r: Reply): string => (r.status === 200 ? '200' : `${r.status} ${(r.json() as { code: string }).code}`);

test(
  'KEYWARD_WORKERS=2, the primary frozen 6 s while a quota key calls: 503 admission_unavailable, and not a unit of the quota is lost',
  { timeout: 120_000 },
  async () => {
    const m = await machine(2);
    try {
      const quota = await m.token('quota');
      assert.equal((await m.call(quota)).status, 200);
      const agent = await m.warm(20);
      const before = m.up.requests.length;
      process.kill(m.primary, 'SIGSTOP');
      const during = Promise.all(Array.from({ length: 20 }, () => m.call(quota, '/seo/v3/x', agent)));
      await new Promise((r) => setTimeout(r, 6_000));
      process.kill(m.primary, 'SIGCONT');
      const statuses = (await during).map(codeOf);
      const forwarded = statuses.filter((s) => s === '200').length;
      for (const s of statuses.filter((x) => x !== '200')) assert.equal(s, '503 admission_unavailable', statuses.join(', '));
      assert.equal(m.up.requests.length - before, forwarded);
      assert.ok(statuses.includes('503 admission_unavailable'), 'requests on connections the workers held waited for the primary');
      agent.destroy();
      // Whatever the primary decided for requests their workers gave up on came back: the quota holds only what was forwarded.
      await eventually(
        async () => (await m.status(quota)).find((l) => l.kind === 'quota')?.used === 1 + forwarded,
        10_000,
        `the quota at ${1 + forwarded} used`,
      );
      for (let i = 0; i < 10; i++) assert.equal((await m.call(quota)).status, 200, 'the key goes on being served');
    } finally {
      await m.stop();
    }
  },
);

test(
  'KEYWARD_WORKERS=2, the primary frozen 6 s with a concurrency key: never refused for good; two in flight at once afterwards',
  { timeout: 120_000 },
  async () => {
    const held: Array<() => void> = [];
    const m = await machine(2, (req, res) => {
      req.resume();
      const answer = (): void => {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end('{"ok":true}');
      };
      if (req.url?.includes('slow') === true) held.push(answer);
      else answer();
    });
    try {
      const conc = await m.token('conc');
      const agent = await m.warm(4);
      process.kill(m.primary, 'SIGSTOP');
      const during = Promise.all(Array.from({ length: 4 }, () => m.call(conc, '/seo/v3/x', agent)));
      await new Promise((r) => setTimeout(r, 6_000));
      process.kill(m.primary, 'SIGCONT');
      assert.deepEqual(
        (await during).map(codeOf),
        Array.from({ length: 4 }, () => '503 admission_unavailable'),
      );
      agent.destroy();
      // Nothing is held for requests that were given up on: two overlapping calls go through at once.
      const overlapping = Array.from({ length: 2 }, () => m.call(conc, '/seo/v3/slow'));
      await eventually(() => held.length === 2, 10_000, 'two in flight');
      for (const release of held.splice(0)) release();
      assert.deepEqual((await Promise.all(overlapping)).map(codeOf), ['200', '200']);
      // Each worker tells the primary a request is over as its response ends; the status may be asked through the other worker first.
      await eventually(async () => (await m.status(conc)).find((l) => l.kind === 'concurrency')?.used === 0, 5_000, 'both slots back at the primary');
    } finally {
      for (const release of held.splice(0)) release();
      await m.stop();
    }
  },
);

test(
  'KEYWARD_WORKERS=3, a budget whose cost comes 9 s into the stream, 40 calls at once: no call times out at the primary, none refused as another limit, the status never above what was spent',
  { timeout: 120_000 },
  async () => {
    // The SEO cost is the body's top-level field, in the last chunk, 9 s after the head.
    const m = await machine(3, (req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"status_code":20000,"tasks":[],');
      setTimeout(() => res.end('"cost":0.3}'), 9_000);
    });
    try {
      const budget = await m.token('budget');
      const statuses = (await Promise.all(Array.from({ length: 40 }, () => m.call(budget)))).map(codeOf);
      const forwarded = statuses.filter((s) => s === '200').length;
      assert.ok(forwarded >= 1, statuses.join(', '));
      for (const s of statuses.filter((x) => x !== '200')) assert.ok(s === '503 admission_unavailable' || s === '429 budget_exceeded', statuses.join(', '));
      assert.equal(m.up.requests.length, forwarded);
      const spent = Math.round(forwarded * 0.3 * 1e6) / 1e6;
      const usedNow = async (): Promise<number> => (await m.status(budget)).find((l) => l.kind === 'budget')?.used ?? -1;
      // Never above what was spent; the last calls' costs reach the primary just after their answers do.
      assert.ok((await usedNow()) <= spent, `status above the ${spent} spent`);
      await eventually(async () => (await usedNow()) === spent, 10_000, `status at the ${spent} spent by ${forwarded} forwarded at 0.3`);
      const used = await usedNow();
      // What is left is still served, at what a call was seen to cost.
      if (used < 1) assert.equal(codeOf(await m.call(budget)), '200');
    } finally {
      await m.stop();
    }
  },
);

test(
  'KEYWARD_WORKERS=2, one worker frozen 10 s during 40 overlapping budget calls: the status is what was forwarded, and what is left is served',
  { timeout: 120_000 },
  async () => {
    const m = await machine(2, (req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"status_code":20000,"cost":0.1,"tasks":[]}');
    });
    try {
      const budget = await m.token('budget');
      assert.equal(codeOf(await m.call(budget)), '200', 'the first call teaches the cost');
      const agent = await m.warm(20);
      const before = m.up.requests.length;
      process.kill(m.workers[1] as number, 'SIGSTOP');
      const calls = Promise.all(Array.from({ length: 40 }, () => m.call(budget, '/seo/v3/x', agent)));
      await new Promise((r) => setTimeout(r, 10_000));
      process.kill(m.workers[1] as number, 'SIGCONT');
      const statuses = (await calls).map(codeOf);
      for (const s of statuses.filter((x) => x !== '200')) assert.ok(s === '429 budget_exceeded' || s === '503 admission_unavailable', statuses.join(', '));
      const forwarded = 1 + m.up.requests.length - before;
      await eventually(
        async () => (await m.status(budget)).find((l) => l.kind === 'budget')?.used === Math.round(forwarded * 0.1 * 1e6) / 1e6,
        10_000,
        `the budget at ${forwarded} calls of 0.1`,
      );
      assert.ok(forwarded <= 10, `${forwarded} forwarded against 1 USD at 0.1`);
      if (forwarded < 10) assert.equal(codeOf(await m.call(budget)), '200', 'what is left is served');
      agent.destroy();
    } finally {
      process.kill(m.workers[1] as number, 'SIGCONT');
      await m.stop();
    }
  },
);
