// A row keyward would never write (docs/fleet.md, "Changing keys with SQL"):
// skipped alone, logged once by id and counted; the rest of the set keeps
// serving and changing.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { KeyRecord } from '../../src/keys/keyset.ts';
import { generateToken, tokenDigest as hexDigest } from '../../src/keys/token.ts';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { parseProm } from '../support/prom.ts';
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

test('a row keyward would never write is skipped alone, logged once by id and counted; the rest keeps serving and changing', { timeout: 90_000 }, async () => {
  await withGateway(async ({ db, env, base, admin, output }) => {
    const good = JSON.parse((await runCli(['keys', 'create', '--name', 'good', '--json'], env)).stdout) as { id: string; token: string };
    // A rotated-out entry without a digest, and grace dates that are not dates.
    const bad = [
      await insertBySql(db, 'nodigest', [{ until: '2999-01-01T00:00:00Z' }]),
      await insertBySql(db, 'number', [{ digest: tokenDigest(generateToken()), until: 4102444800000 }]),
      await insertBySql(db, 'never', [{ digest: tokenDigest(generateToken()), until: 'never' }]),
      await insertBySql(db, 'null', [{ digest: tokenDigest(generateToken()), until: null }]),
      await insertBySql(db, 'empty', [{ digest: tokenDigest(generateToken()), until: '' }]),
      await insertBySql(db, 'notalist', { digest: 'x' }),
    ];
    const invalidRows = async (): Promise<number> => parseProm((await request(`${admin}/metrics`)).body.toString()).sum('keyward_keystore_invalid_rows');
    await eventually(async () => (await invalidRows()) === bad.length, 3_000, 'invalid rows counted');
    for (const b of bad) assert.equal(await status(base, b.token), 401, `${b.id} opens nothing`);
    // The rest still changes: a CLI revocation and a new key are in force within a second.
    assert.equal((await runCli(['keys', 'revoke', good.id], env)).code, 0);
    await eventually(async () => (await status(base, good.token)) === 401, 2_000, 'revocation through the CLI after a bad row');
    const fresh = JSON.parse((await runCli(['keys', 'create', '--name', 'fresh', '--json'], env)).stdout) as { token: string };
    await eventually(async () => (await status(base, fresh.token)) === 200, 2_000, 'a new key after a bad row');
    const ready = await request(`${admin}/readyz`);
    assert.equal(ready.status, 200);
    assert.equal(parseProm((await request(`${admin}/metrics`)).body.toString()).sum('keyward_keystore_up'), 1);
    // Logged once each, by id, with what is wrong; never a digest.
    await new Promise((r) => setTimeout(r, 1_500)); // more checks pass: still once
    const lines = output()
      .split('\n')
      .filter((l) => l.includes('stored key skipped'));
    assert.deepEqual(lines.map((l) => (JSON.parse(l) as { id: string }).id).sort(), bad.map((b) => b.id).sort());
    assert.match(lines.find((l) => l.includes('nodigest')) as string, /"problem":".previous entries must have a digest and an \\"until\\" date"/);
    assert.equal(output().includes('sha256:'), false);
    // A row fixed by SQL opens its key; a good key broken by SQL stops at once.
    await db.admin`update keyward_keys set previous = '[]' where id = ${bad[0]?.id as string}`;
    await eventually(async () => (await status(base, bad[0]?.token as string)) === 200, 2_000, 'a fixed row opens its key');
    await db.admin`update keyward_keys set digest = 'not a digest' where name = 'fresh'`;
    await eventually(async () => (await status(base, fresh.token)) === 401, 2_000, 'a key broken by SQL refused');
    await eventually(async () => (await invalidRows()) === bad.length, 2_000, 'one fixed, one broken');
    // Export and list give the valid keys only: an export imports cleanly into a keys file.
    const exported = JSON.parse((await runCli(['keys', 'export'], env)).stdout) as { keys: KeyRecord[] };
    assert.deepEqual(exported.keys.map((k) => k.name).sort(), ['good', 'nodigest']);
  });
});
