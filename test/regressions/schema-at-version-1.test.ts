// A database at schema version 1 (docs/fleet.md, "Schema"): upgraded to the
// current one with its keys kept, and SQL changes reach gateways from then on.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { MIGRATIONS } from '../../src/keys/pg-schema.ts';
import { generateToken, tokenDigest as hexDigest } from '../../src/keys/token.ts';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { startDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';

const tokenDigest = (token: string): string => `sha256:${hexDigest(token)}`;

const status = async (base: string, token: string): Promise<number> =>
  (await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status;

function portOf(output: string, msg: string): number {
  return (JSON.parse(output.split('\n').find((l) => l.includes(`"msg":"${msg}"`)) as string) as { port: number }).port;
}

test('a schema at version 1 is upgraded to the current one, keys kept, and SQL changes reach gateways from then on', { timeout: 90_000 }, async () => {
  const db = await startDatabase();
  const up = await startUpstream();
  const env = { KEYWARD_DATABASE_URL: db.url, KEYWARD_PORT: '0', KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p' };
  try {
    await db.admin.unsafe(
      `create table keyward_schema (version int primary key, applied timestamptz not null default now()); ${MIGRATIONS[0] as string}; insert into keyward_schema (version) values (1);`,
    );
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
