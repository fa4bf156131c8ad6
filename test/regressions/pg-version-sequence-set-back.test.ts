// The version sequence set back (`setval('keyward_keys_version', 1)`): new
// changes got versions at or below the one a gateway held, so no increment
// fetched them and a revocation waited for the ten-second consistency check
// (or for the sequence to pass its old maximum). A gateway now notices the
// sequence behind the highest version, says how to fix it, and reads the
// whole set each time the sequence moves (docs/fleet.md, "How a change
// travels").
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runCli } from '../support/cli.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf } from '../support/fleet.ts';
import { startDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';

test(
  'after setval back to 1, revocations by SQL and by the CLI still reach a gateway within about a second; the operator is told once',
  { timeout: 90_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream();
    const env = { KEYWARD_DATABASE_URL: db.url, KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p', KEYWARD_ADMIN_PORT: 'off' };
    try {
      assert.equal((await runCli(['db', 'migrate'], env)).code, 0);
      const tokens: Record<string, string> = {};
      for (const name of ['a', 'b', 'c', 'd', 'e', 'f'])
        tokens[name] = (JSON.parse((await runCli(['keys', 'create', '--name', name, '--json'], env)).stdout) as { token: string }).token;
      const g = await startFleetGateway(env);
      try {
        for (const t of Object.values(tokens)) await eventually(async () => (await statusOf(g.base, t)) === 200, 5_000, 'served');
        await db.admin`select setval('keyward_keys_version', 1)`;
        const timings: number[] = [];
        for (const name of ['a', 'b']) {
          const at = performance.now();
          await db.admin`update keyward_keys set revoked = now() where name = ${name}`;
          await eventually(async () => (await statusOf(g.base, tokens[name] as string)) === 401, 2_500, `revocation of ${name} by SQL in force`);
          timings.push(performance.now() - at);
        }
        const at = performance.now();
        assert.equal((await runCli(['keys', 'revoke', 'c'], env)).code, 0);
        await eventually(async () => (await statusOf(g.base, tokens.c as string)) === 401, 2_500, 'revocation by the CLI in force');
        timings.push(performance.now() - at);
        assert.equal(await statusOf(g.base, tokens.d as string), 200, 'the other keys still serve');
        await eventually(() => g.output().includes('the key version sequence is behind the highest version'), 5_000, 'the warning logged');
        const warnings = g
          .output()
          .split('\n')
          .filter((l) => l.includes('the key version sequence is behind'));
        assert.equal(warnings.length, 1, 'said once, not at every check');
        assert.match(warnings[0] as string, /"fix":"select setval\('keyward_keys_version', \d+\)"/);
        console.log(`sequence set back: revocations in force after ${timings.map((t) => t.toFixed(0)).join(', ')} ms`);
      } finally {
        await g.stop().catch(() => g.kill());
      }
    } finally {
      await up.close();
      await db.close();
    }
  },
);
