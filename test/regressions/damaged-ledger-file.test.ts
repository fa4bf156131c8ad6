// A SQLite ledger cut to 4 KiB was opened as "counting in memory only", and
// an empty file as a new ledger: either way a key whose 2/day quota was
// spent got two more. A ledger file that exists but cannot be read is now a
// fault (docs/limits.md, "Limits under faults"): keys with a quota or budget
// get 503 ledger_unavailable, keys without limits are served, readiness and
// keyward_ledger_up say why, and the CLI names the file and how to recover.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, truncateSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli } from '../support/cli.ts';
import { startFleetGateway, statusOf } from '../support/fleet.ts';
import { startUpstream } from '../support/upstream.ts';

// Round 4, point 6: with KEYWARD_WORKERS=2 the refusals were right, but /readyz said only "ready":
// the primary's readiness is its workers', and what one of them names is the machine's.
for (const [what, damage, workers] of [
  ['cut to 4 KiB', (path: string) => truncateSync(path, 4096), '1'],
  ['emptied', (path: string) => writeFileSync(path, ''), '1'],
  ['emptied, two workers', (path: string) => writeFileSync(path, ''), '2'],
] as const) {
  test(
    `a ledger file ${what}: a spent quota is not granted again; keys without limits are served; readiness, the metric and the CLI say why`,
    { timeout: 90_000 },
    async () => {
      const dir = mkdtempSync(join(tmpdir(), 'keyward-damaged-'));
      const up = await startUpstream();
      const keysFile = join(dir, 'keys.json');
      const env = {
        KEYWARD_KEYS_FILE: keysFile,
        KEYWARD_SEO_URL: up.url,
        KEYWARD_SEO_LOGIN: 'l',
        KEYWARD_SEO_PASSWORD: 'p',
        KEYWARD_USAGE_FLUSH: '200ms',
        KEYWARD_WORKERS: workers,
      };
      try {
        const spent = JSON.parse((await runCli(['keys', 'create', '--name', 'spent', '--quota', '2/day', '--json'], env)).stdout) as { token: string };
        const free = JSON.parse((await runCli(['keys', 'create', '--name', 'free', '--json'], env)).stdout) as { token: string };
        // Rows enough that the file is larger than 4 KiB, then the quota spent.
        for (let i = 0; i < 3; i++) assert.equal((await runCli(['keys', 'create', '--name', `filler-${i}`, '--quota', '9/day'], env)).code, 0);
        const first = await startFleetGateway(env);
        assert.equal(await statusOf(first.base, spent.token), 200);
        assert.equal(await statusOf(first.base, spent.token), 200);
        assert.equal(await statusOf(first.base, spent.token), 429);
        assert.equal((await first.stop()).code, 0);
        damage(`${keysFile}.usage.sqlite`);

        const g = await startFleetGateway(env);
        try {
          assert.equal(await statusOf(g.base, spent.token), 503, 'the spent quota is not granted again');
          const refused = await request(`${g.base}/seo/v3/x`, { headers: { authorization: `Bearer ${spent.token}` } });
          assert.equal((refused.json() as { code: string }).code, 'ledger_unavailable');
          assert.equal(await statusOf(g.base, free.token), 200, 'a key without limits is served');
          const ready = await request(`${g.admin as string}/readyz`);
          assert.equal(ready.status, 200);
          assert.match((ready.json() as { problem: string }).problem, /usage ledger .*keys\.json\.usage\.sqlite cannot be read/);
          if (workers === '1') assert.match((await request(`${g.admin as string}/metrics`)).body.toString(), /^keyward_ledger_up 0$/m);
          assert.equal(up.requests.length, 3, 'two for the spent key before, one for the free key');
        } finally {
          await g.stop().catch(() => g.kill());
        }
        const usage = await runCli(['usage'], env);
        assert.equal(usage.code, 1);
        assert.match(usage.stderr, /usage ledger .*keys\.json\.usage\.sqlite cannot be read .*mv .*\.damaged/);
        const list = await runCli(['keys', 'list'], env);
        assert.equal(list.code, 0, 'the keys are listed all the same');
        assert.match(list.stderr, /cannot be read/);
      } finally {
        await up.close();
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
}
