// A change made with the triggers switched off sends no notification
// (docs/fleet.md): the periodic consistency check catches it.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { startDatabase, type TestDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';
import { seoFleetEnv } from '../support/fleet.ts';

const status = async (base: string, token: string): Promise<number> =>
  (await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status;

function portOf(output: string, msg: string): number {
  return (JSON.parse(output.split('\n').find((l) => l.includes(`"msg":"${msg}"`)) as string) as { port: number }).port;
}

/** How long `check` took to hold, ms; fails past `ms`. */
async function timeUntil(check: () => Promise<boolean>, ms: number, what: string): Promise<number> {
  const at = performance.now();
  await eventually(check, ms, what);
  return performance.now() - at;
}

async function withGateway(
  run: (ctx: { db: TestDatabase; env: Record<string, string>; base: string; admin: string; output: () => string }) => Promise<void>,
): Promise<void> {
  const db = await startDatabase();
  const up = await startUpstream();
  const env = seoFleetEnv(db.url, up.url);
  assert.equal((await runCli(['db', 'migrate'], env)).code, 0);
  const gw = await startCli(['serve'], env, '"msg":"admin listening"');
  try {
    await run({
      db,
      env,
      base: `http://127.0.0.1:${portOf(gw.output(), 'keyward listening')}`,
      admin: `http://127.0.0.1:${portOf(gw.output(), 'admin listening')}`,
      output: gw.output,
    });
  } finally {
    gw.child.kill('SIGTERM');
    await deadline(gw.done, 10_000, 'exit');
    await up.close();
    await db.close();
  }
}

test('a change made with the triggers switched off is caught by the periodic consistency check', { timeout: 90_000 }, async () => {
  await withGateway(async ({ db, env, base }) => {
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'quiet', '--json'], env)).stdout) as { token: string };
    await eventually(async () => (await status(base, key.token)) === 200, 2_000, 'key accepted');
    // Replica mode skips triggers: no new version, no tombstone, no notification.
    await db.admin.begin(async (tx) => {
      await tx`set local session_replication_role = replica`;
      await tx`update keyward_keys set revoked = now() where name = 'quiet'`;
    });
    const took = await timeUntil(async () => (await status(base, key.token)) === 401, 15_000, 'a silent change caught');
    console.log(`a change made with the triggers off was in effect ${took.toFixed(0)} ms later (checked every 10 s)`);
  });
});
