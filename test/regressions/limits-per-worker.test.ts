// With KEYWARD_WORKERS=2 every limit was per worker: `--rate 4/h --burst 4`
// admitted 8 of 16, `--quota 5/day` 10 of 20, `--concurrency 2` 4 of 8. The
// primary now decides for the machine (docs/limits.md, "One key, one
// limit"): the counts are those of one process. Real worker processes,
// real sockets, a new connection per request (the kernel hands connections
// to workers in turn).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { listeningPort, runCli, startCli } from '../support/cli.ts';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startUpstream } from '../support/upstream.ts';

test(
  'KEYWARD_WORKERS=2: rate, quota, concurrency and budget admit what one process admits; the ledger holds what was forwarded',
  { timeout: 120_000 },
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'keyward-workers-'));
    // Slow calls are held at the upstream until the test has seen every one of
    // an overlapping batch either refused or held: overlap by construction, not
    // by a timer a loaded machine might outlast.
    const held: Array<() => void> = [];
    const up = await startUpstream(async (req, res) => {
      req.resume();
      if (req.url?.includes('slow') === true) await new Promise<void>((release) => held.push(release));
      if (req.url?.startsWith('/v1/') === true) {
        res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': '10' });
        return void res.end('mp3');
      }
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end('{"ok":true}');
    });
    const env = {
      KEYWARD_WORKERS: '2',
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'me',
      KEYWARD_SEO_PASSWORD: 'pw',
      KEYWARD_SPEECH_URL: up.url,
      KEYWARD_SPEECH_KEY: 'speech-secret-0123456789',
      KEYWARD_USAGE_FLUSH: '200ms',
    };
    const create = async (name: string, ...flags: string[]): Promise<string> => {
      const r = await runCli(['keys', 'create', '--name', name, '--json', ...flags], env);
      assert.equal(r.code, 0, r.stderr);
      return (JSON.parse(r.stdout) as { token: string }).token;
    };
    const rate = await create('rate', '--rate', '4/h', '--burst', '4');
    const quota = await create('quota', '--quota', '5/day');
    const conc = await create('conc', '--concurrency', '2');
    const budget = await create('budget', '--budget', 'speech=35/day');
    const serve = await startCli(['serve'], { ...env, KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: 'off' }, '"msg":"keyward listening"');
    try {
      await eventually(() => serve.output().split('"msg":"keyward listening"').length === 3, 10_000, 'two workers listening');
      const base = `http://127.0.0.1:${listeningPort(serve.output())}`;
      const call = async (token: string, path = '/seo/v3/x'): Promise<number> =>
        (await request(`${base}${path}`, { headers: { authorization: `Bearer ${token}` } })).status;

      const rateStatuses: number[] = [];
      for (let i = 0; i < 16; i++) rateStatuses.push(await call(rate));
      const quotaStatuses: number[] = [];
      for (let i = 0; i < 20; i++) quotaStatuses.push(await call(quota));
      /** `n` overlapping calls: once each is refused or held at the upstream, the held ones are let go. */
      const overlapping = async (n: number, token: string, path: string): Promise<number[]> => {
        let answered = 0;
        const calls = Array.from({ length: n }, () => call(token, path).finally(() => answered++));
        await eventually(() => answered + held.length === n, 20_000, 'every call refused or held');
        for (const release of held.splice(0)) release();
        return Promise.all(calls);
      };
      const concStatuses = await overlapping(8, conc, '/seo/v3/slow');
      // Budget: one call teaches the cost (10 characters), then overlapping calls.
      const first = await call(budget, '/speech/v1/text-to-speech/v');
      const budgetStatuses = [first, ...(await overlapping(8, budget, '/speech/v1/text-to-speech/slow'))];

      const ok = (s: number[]): number => s.filter((x) => x === 200).length;
      assert.equal(ok(rateStatuses), 4, `rate 4/h burst 4: ${rateStatuses.join(',')}`);
      assert.equal(ok(quotaStatuses), 5, `quota 5/day: ${quotaStatuses.join(',')}`);
      assert.equal(ok(concStatuses), 2, `concurrency 2 of 8 overlapping: ${concStatuses.join(',')}`);
      assert.equal(ok(budgetStatuses), Math.ceil(35 / 10), `budget 35 at 10 a call: ${budgetStatuses.join(',')}`);

      serve.child.kill('SIGTERM');
      const done = await deadline(serve.done, 15_000, 'exit');
      assert.equal(done.code, 0);
      // Both workers served (the test proves nothing otherwise); log lines are complete once they stopped.
      const pids = new Set(
        done.stdout
          .split('\n')
          .filter((l) => l.includes('"msg":"request completed"'))
          .map((l) => (JSON.parse(l) as { pid: number }).pid),
      );
      assert.equal(pids.size, 2, 'requests reached both workers');
      const rows = JSON.parse((await runCli(['usage', '--json'], env)).stdout) as Array<{ key: string; requests: number }>;
      const forwarded = (name: string): number => rows.filter((r) => r.key === name).reduce((n, r) => n + r.requests, 0);
      assert.deepEqual(
        { rate: forwarded('rate'), quota: forwarded('quota'), conc: forwarded('conc'), budget: forwarded('budget') },
        { rate: 4, quota: 5, conc: 2, budget: 4 },
      );
      assert.equal(up.requests.length, 4 + 5 + 2 + 4, 'the upstream saw exactly what the ledger holds');
    } finally {
      serve.child.kill('SIGKILL');
      await up.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
