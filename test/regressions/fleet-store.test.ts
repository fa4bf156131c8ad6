// The PostgreSQL store against a real server, with rows written by SQL as a
// DBA would (docs/fleet.md, "Changing keys with SQL"): every change reaches
// a running gateway within a second, a row keyward would never write is
// skipped alone, and a set that cannot be put in force fails closed.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MIGRATIONS } from '../../src/keys/pg-schema.ts';
import { PgKeyStore } from '../../src/keys/pg-store.ts';
import type { KeyRecord } from '../../src/keys/keyset.ts';
import { generateToken, tokenDigest as hexDigest } from '../../src/keys/token.ts';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { parseProm } from '../support/prom.ts';
import { startDatabase, type TestDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';

const tokenDigest = (token: string): string => `sha256:${hexDigest(token)}`;
const status = async (base: string, token: string): Promise<number> => (await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status;

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

async function withGateway(run: (ctx: { db: TestDatabase; env: Record<string, string>; base: string; admin: string; output: () => string }) => Promise<void>): Promise<void> {
  const db = await startDatabase();
  const up = await startUpstream();
  const env = { KEYWARD_DATABASE_URL: db.url, KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: '0', KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p' };
  assert.equal((await runCli(['db', 'migrate'], env)).code, 0);
  const gw = await startCli(['serve'], env, '"msg":"admin listening"');
  try {
    await run({ db, env, base: `http://127.0.0.1:${portOf(gw.output(), 'keyward listening')}`, admin: `http://127.0.0.1:${portOf(gw.output(), 'admin listening')}`, output: gw.output });
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
    const tookTruncate = await timeUntil(async () => (await status(base, cli.token)) === 401 && (await status(base, deleted.token)) === 401, 2_000, 'a truncated table refuses everything');
    console.log(`SQL writes in effect after: insert ${tookInsert.toFixed(0)} ms, revoke ${tookRevoke.toFixed(0)} ms, delete ${tookDelete.toFixed(0)} ms, truncate ${tookTruncate.toFixed(0)} ms`);
  });
});

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
    const lines = output().split('\n').filter((l) => l.includes('stored key skipped'));
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

test('a schema at version 1 is upgraded to the current one, keys kept, and SQL changes reach gateways from then on', { timeout: 90_000 }, async () => {
  const db = await startDatabase();
  const up = await startUpstream();
  const env = { KEYWARD_DATABASE_URL: db.url, KEYWARD_PORT: '0', KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p' };
  try {
    await db.admin.unsafe(`create table keyward_schema (version int primary key, applied timestamptz not null default now()); ${MIGRATIONS[0] as string}; insert into keyward_schema (version) values (1);`);
    const token = generateToken();
    await db.admin`insert into keyward_keys (id, name, digest, created, version) values ('key_old', 'old', ${tokenDigest(token)}, now(), nextval('keyward_keys_version'))`;
    const migrated = await runCli(['db', 'migrate'], env);
    assert.equal(migrated.stdout, `Upgraded the database schema from version 1 to ${MIGRATIONS.length}.\n`);
    const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
    try {
      const base = `http://127.0.0.1:${portOf(gw.output(), 'keyward listening')}`;
      assert.equal(await status(base, token), 200);
      await db.admin`delete from keyward_keys where id = 'key_old'`;
      await eventually(async () => (await status(base, token)) === 401, 2_000, 'deleted after the upgrade');
    } finally {
      gw.child.kill('SIGTERM');
      await deadline(gw.done, 10_000, 'exit');
    }
  } finally {
    await up.close();
    await db.close();
  }
});

test('a key set the gateway could not put in force leaves the store down and is applied again; the version never moves past it', { timeout: 60_000 }, async () => {
  const db = await startDatabase();
  const store = new PgKeyStore(db.url);
  await store.migrate();
  const seen: number[] = [];
  const statuses: boolean[] = [];
  let refuse = false;
  const stop = store.watch(
    (records) => {
      seen.push(records.length);
      if (refuse) throw new Error('cannot apply');
    },
    () => undefined,
    (up) => statuses.push(up),
  );
  try {
    await eventually(() => seen.length >= 1, 5_000, 'first load');
    refuse = true;
    await insertBySql(db, 'one');
    await eventually(() => statuses.includes(false), 5_000, 'reported down after a failed apply');
    // The periodic check succeeds meanwhile, yet the store stays down while the set is not in force.
    await new Promise((r) => setTimeout(r, 2_500));
    assert.deepEqual(statuses, [false]);
    assert.ok(seen.filter((n) => n === 1).length >= 2, `retried: ${JSON.stringify(seen)}`);
    refuse = false;
    await eventually(() => statuses.at(-1) === true, 5_000, 'up once applied');
    assert.equal(seen.at(-1), 1);
  } finally {
    stop();
    await store.close();
    await db.close();
  }
});
