// docs/credentials.md, "Capacity", with KEYWARD_WORKERS > 1: the primary
// holds each credential's count for the machine. A counting upstream records
// the most requests it ever had in flight per credential.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import { freePort } from '../../src/process/listen.ts';
import { request, type Reply } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { countingUpstream, type CountingOptions, type CountingUpstream } from '../support/counting-upstream.ts';
import { parseProm } from '../support/prom.ts';

const SPEECH = '/speech/v1/text-to-speech/voice1';

interface Machine {
  /** The public port's URL: the latest workers' (all workers replaced, port 0 is bound anew). */
  readonly base: string;
  admin: string;
  token: string;
  up: CountingUpstream;
  workerPids(): number[];
  /** The primary's pid (signals go to it). */
  readonly primary: number;
  output(): string;
}

async function withMachine(
  o: Omit<CountingOptions, 'secrets' | 'header'> & { credentials: number; env: Record<string, string> },
  run: (m: Machine) => Promise<void>,
) {
  const tag = randomBytes(5).toString('hex');
  const secrets = Array.from({ length: o.credentials }, (_, i) => `sk_WCAP${i + 1}SECRET${tag}`);
  const up = await countingUpstream({ ...o, secrets, header: 'xi-api-key' });
  const dir = mkdtempSync(join(tmpdir(), 'keyward-capacity-'));
  const adminPort = await freePort();
  const env: Record<string, string> = {
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_PORT: '0',
    KEYWARD_ADMIN_PORT: String(adminPort),
    KEYWARD_WORKERS: '2',
    KEYWARD_SPEECH_URL: up.url,
    ...Object.fromEntries(secrets.map((s, i) => [i === 0 ? 'KEYWARD_SPEECH_KEY' : `KEYWARD_SPEECH_KEY_${i + 1}`, s])),
    ...o.env,
  };
  const created = await runCli(['keys', 'create', '--name', 'w', '--json'], env);
  assert.equal(created.code, 0, created.stderr);
  const token = (JSON.parse(created.stdout) as { token: string }).token;
  const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
  try {
    const listening = () =>
      gw
        .output()
        .split('\n')
        .filter((l) => l.includes('"msg":"keyward listening"'))
        .map((l) => JSON.parse(l) as { port: number; pid: number });
    await eventually(() => listening().length >= 2, 20_000, 'both workers listening');
    await run({
      get base() {
        return `http://127.0.0.1:${listening().at(-1)?.port as number}`;
      },
      admin: `http://127.0.0.1:${adminPort}`,
      token,
      up,
      workerPids: () => [...new Set(listening().map((l) => l.pid))],
      primary: gw.child.pid as number,
      output: gw.output,
    });
  } finally {
    gw.child.kill('SIGTERM');
    await gw.done;
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

const post = (m: Machine, who: string): Promise<Reply> =>
  request(`${m.base}${SPEECH}`, {
    method: 'POST',
    // A new connection each: the kernel spreads them over both workers.
    headers: { authorization: `Bearer ${m.token}`, 'content-type': 'application/json', 'x-who': who, connection: 'close' },
    body: '{"text":"hello"}',
    timeoutMs: 30_000,
  });

test(
  'two workers: bursts of 30 on two accounts of concurrency 2 never passes 2 in flight on either; readiness and metrics from the primary',
  { timeout: 120_000 },
  async () => {
    await withMachine({ credentials: 2, allow: 2, holdMs: 40, env: { KEYWARD_SPEECH_CONCURRENCY: '2' } }, async (m) => {
      // Bursts of 30 until both workers have served some (the kernel decides which worker accepts a connection).
      const servedBy = () =>
        new Set(
          m
            .output()
            .split('\n')
            .filter((l) => l.includes('"msg":"request completed"'))
            .map((l) => (JSON.parse(l) as { pid: number }).pid),
        );
      for (let round = 0; round < 6 && (round < 2 || servedBy().size < 2); round++) {
        const replies = await Promise.all(Array.from({ length: 30 }, (_, i) => post(m, `r${round}-${i}`)));
        assert.deepEqual(
          replies.map((r) => r.status),
          replies.map(() => 200),
        );
      }
      assert.equal(servedBy().size, 2, 'both workers served');
      assert.equal(m.up.refusedForConcurrency(), 0);
      assert.deepEqual([m.up.most.get(1), m.up.most.get(2)], [2, 2]);
      const ready = (await request(`${m.admin}/readyz`)).json() as { capacity?: Record<string, unknown> };
      assert.deepEqual(ready.capacity, { speech: { inFlight: 0, limit: 4, queued: 0 } });
      const metrics = parseProm((await request(`${m.admin}/metrics`)).body.toString());
      assert.ok(metrics.declared.has('keyward_upstream_in_flight'));
      assert.equal(metrics.sum('keyward_upstream_in_flight', { route: 'speech' }), 0);
      assert.ok(metrics.sum('keyward_upstream_queue_wait_seconds_count', { route: 'speech' }) >= 40);
    });
  },
);

test('a worker killed while holding room gives it back: the next request goes, the bound still holds', { timeout: 120_000 }, async () => {
  await withMachine(
    {
      credentials: 1,
      allow: 1,
      holdMs: 20,
      holdFor: (who) => (who === 'stuck' ? 'never' : 20),
      env: { KEYWARD_SPEECH_CONCURRENCY: '1', KEYWARD_QUEUE_WAIT: '20s' },
    },
    async (m) => {
      const stuck = post(m, 'stuck').catch(() => null);
      await eventually(() => m.up.arrivals.length === 1, 10_000, 'the stuck request forwarded');
      const waiting = post(m, 'waiting').catch(() => null);
      await eventually(
        async () => (((await request(`${m.admin}/readyz`)).json() as { capacity?: { speech?: { queued: number } } }).capacity?.speech?.queued ?? 0) === 1,
        10_000,
        'the second waiting',
      );
      // Both workers die at once (whichever held the room, and whichever held the waiting request).
      const pids = m.workerPids();
      for (const pid of pids) process.kill(pid, 'SIGKILL');
      assert.equal(await stuck, null);
      await eventually(() => m.workerPids().length >= 4, 20_000, 'both workers replaced');
      const after = await post(m, 'after');
      assert.equal(after.status, 200);
      assert.equal(m.up.most.get(1), 1);
      await waiting;
      assert.ok(!m.up.arrivals.some((a) => a.who === 'waiting'), 'a waiting request whose worker died is never forwarded');
    },
  );
});

test('two workers: a reload (SIGHUP) gives the primary the new capacity for the whole machine', { timeout: 120_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-capacity-reload-'));
  const configFile = join(dir, 'keyward.env');
  writeFileSync(configFile, 'KEYWARD_SPEECH_CONCURRENCY=1\n');
  try {
    await withMachine({ credentials: 1, allow: 2, holdMs: 60, env: { KEYWARD_CONFIG_FILE: configFile } }, async (m) => {
      const ready = async () => ((await request(`${m.admin}/readyz`)).json() as { capacity?: { speech?: { limit: number } } }).capacity?.speech?.limit;
      assert.equal(await ready(), 1);
      await Promise.all(Array.from({ length: 10 }, (_, i) => post(m, `one${i}`)));
      assert.equal(m.up.most.get(1), 1);
      writeFileSync(configFile, 'KEYWARD_SPEECH_CONCURRENCY=2\n');
      process.kill(m.primary, 'SIGHUP');
      await eventually(async () => (await ready()) === 2, 10_000, 'the primary holding the new capacity');
      m.up.most.clear();
      const replies = await Promise.all(Array.from({ length: 20 }, (_, i) => post(m, `two${i}`)));
      assert.ok(replies.every((r) => r.status === 200));
      assert.equal(m.up.most.get(1), 2);
      assert.equal(m.up.refusedForConcurrency(), 0);
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
