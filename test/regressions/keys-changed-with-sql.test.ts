// Keys inserted, revoked, deleted or truncated with SQL, as a DBA would
// (docs/fleet.md, "Changing keys with SQL"): every change reaches a running
// gateway within a second, no version given by hand.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { generateToken, tokenDigest as hexDigest } from '../../src/keys/token.ts';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { startDatabase, type TestDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';
import { seoFleetEnv } from '../support/fleet.ts';

const tokenDigest = (token: string): string => `sha256:${hexDigest(token)}`;

const status = async (base: string, token: string): Promise<number> =>
  (await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status;

function portOf(output: string, msg: string): number {
  return (JSON.parse(output.split('\n').find((l) => l.includes(`"msg":"${msg}"`)) as string) as { port: number }).port;
}

/** A key written straight into the table, as a DBA would (no version: the triggers give it one). */
async function insertBySql(db: TestDatabase, name: string, previous: unknown = []): Promise<{ id: string; token: string }> {
  const token = generateToken();
  const id = `key_sql_${name}`;
  await db.admin`insert into keyward_keys (id, name, digest, created, previous) values (${id}, ${name}, ${tokenDigest(token)}, now(), ${db.admin.json(previous as never)})`;
  return { id, token };
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

test('keys inserted, revoked, deleted or truncated with SQL (no version given) reach a running gateway within a second', { timeout: 90_000 }, async () => {
  await withGateway(async ({ db, env, base }) => {
    const cli = JSON.parse((await runCli(['keys', 'create', '--name', 'cli', '--json'], env)).stdout) as { token: string };
    const inserted = await insertBySql(db, 'inserted');
    const tookInsert = await timeUntil(async () => (await status(base, inserted.token)) === 200, 2_000, 'a key inserted with SQL accepted');
    await db.admin`update keyward_keys set revoked = now() where id = ${inserted.id}`;
    const tookRevoke = await timeUntil(async () => (await status(base, inserted.token)) === 401, 2_000, 'a revocation made with SQL refused');
    const listed = JSON.parse((await runCli(['keys', 'list', '--json'], env)).stdout) as Array<{ name: string; revoked: string | null }>;
    assert.notEqual(listed.find((k) => k.name === 'inserted')?.revoked ?? null, null, 'keys list agrees');
    const deleted = await insertBySql(db, 'deleted');
    await eventually(async () => (await status(base, deleted.token)) === 200, 2_000, 'second key accepted');
    await db.admin`delete from keyward_keys where name = 'deleted'`;
    const tookDelete = await timeUntil(async () => (await status(base, deleted.token)) === 401, 2_000, 'a key deleted with SQL refused');
    // Deleted and created again under the same id: present again.
    await db.admin`insert into keyward_keys (id, name, digest, created) values (${deleted.id}, 'again', ${tokenDigest(deleted.token)}, now())`;
    await eventually(async () => (await status(base, deleted.token)) === 200, 2_000, 'a key created again under a deleted id');
    assert.equal(await status(base, cli.token), 200, 'the untouched key serves throughout');
    await db.admin`truncate keyward_keys`;
    const tookTruncate = await timeUntil(
      async () => (await status(base, cli.token)) === 401 && (await status(base, deleted.token)) === 401,
      2_000,
      'a truncated table refuses everything',
    );
    console.log(
      `SQL writes in effect after: insert ${tookInsert.toFixed(0)} ms, revoke ${tookRevoke.toFixed(0)} ms, delete ${tookDelete.toFixed(0)} ms, truncate ${tookTruncate.toFixed(0)} ms`,
    );
  });
});
