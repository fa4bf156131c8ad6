// Many gateways, one PostgreSQL (docs/fleet.md), against a real server.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { serialiseKeysFile } from '../../src/keys/file-store.ts';
import { generateToken, tokenDigest } from '../../src/keys/token.ts';
import { MIGRATIONS } from '../../src/keys/pg-schema.ts';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { manyKeys, withFleet } from '../support/fleet.ts';
import { startDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';

const status = async (base: string, token: string): Promise<number> =>
  (await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status;

function portOf(output: string, msg: string): number {
  return (JSON.parse(output.split('\n').find((l) => l.includes(`"msg":"${msg}"`)) as string) as { port: number }).port;
}

test('the keys CLI works the same against PostgreSQL; import is idempotent, export gives digests only', async () => {
  const db = await startDatabase();
  const dir = mkdtempSync(join(tmpdir(), 'keyward-pgcli-'));
  try {
    const env = { KEYWARD_DATABASE_URL: db.url };
    const migrated = await runCli(['db', 'migrate'], env);
    assert.equal(migrated.code, 0, migrated.stderr);
    const host = new URL(db.url);
    assert.equal(migrated.stderr.split('\n')[0], `keyward: keys in postgres 127.0.0.1:${host.port}${host.pathname}`);
    assert.equal(migrated.stderr.includes(host.password), false, 'never the password');
    assert.equal(migrated.stdout, `Created keyward's tables (schema version ${MIGRATIONS.length}).\n`);
    assert.equal((await runCli(['db', 'migrate'], env)).stdout, `Database schema already at version ${MIGRATIONS.length}; nothing to do.\n`);
    const alice = JSON.parse((await runCli(['keys', 'create', '--name', 'alice', '--routes', 'seo', '--json'], env)).stdout) as { id: string; token: string };
    assert.match(alice.token, /^kw_/);
    const rotated = await runCli(['keys', 'rotate', 'alice', '--grace', '1h', '--json'], env);
    assert.equal(rotated.code, 0, rotated.stderr);
    assert.equal((await runCli(['keys', 'update', 'alice', '--routes', 'all'], env)).code, 0);
    // Each change is announced on the channel, naming the version written and the key.
    const notices: string[] = [];
    const listener = await db.admin.listen('keyward_keys', (payload) => notices.push(payload));
    assert.equal((await runCli(['keys', 'revoke', alice.id], env)).code, 0);
    await eventually(() => notices.length === 1, 5_000, 'notification');
    const announced = JSON.parse(notices[0] as string) as { version: string; ids: string[] };
    assert.deepEqual(announced.ids, [alice.id]);
    const [{ v }] = (await db.admin`select version::text as v from keyward_keys where id = ${alice.id}`) as unknown as [{ v: string }];
    assert.equal(announced.version, v);
    await listener.unlisten();
    assert.match((await runCli(['keys', 'revoke', 'alice'], env)).stdout, /already revoked/);
    const listed = JSON.parse((await runCli(['keys', 'list', '--json'], env)).stdout) as Array<{ id: string; routes: unknown; revoked: string | null }>;
    assert.equal(listed.length, 1);
    assert.equal(listed[0]?.routes, null);
    assert.notEqual(listed[0]?.revoked, null);

    const file = join(dir, 'keys.json');
    const token = generateToken();
    writeFileSync(
      file,
      serialiseKeysFile([
        { id: 'key_fromfile0001', name: 'bob', digest: `sha256:${tokenDigest(token)}`, created: '2026-01-01T00:00:00.000Z', expires: null, revoked: null },
      ]),
    );
    assert.match((await runCli(['keys', 'import', file], env)).stdout, /Imported 1 of 1 keys/);
    assert.match((await runCli(['keys', 'import', file], env)).stdout, /Imported 0 of 1 keys \(1 were already there\)/);
    const exported = await runCli(['keys', 'export'], env);
    assert.equal(exported.code, 0);
    assert.equal(exported.stdout.includes(token), false);
    assert.equal(exported.stdout.includes(alice.token), false);
    assert.match(exported.stdout, new RegExp(tokenDigest(token)));
    // and back into a file store: the same keys
    const back = join(dir, 'back.json');
    writeFileSync(back, exported.stdout);
    const fileList = JSON.parse((await runCli(['keys', 'list', '--json'], { KEYWARD_KEYS_FILE: back })).stdout) as Array<{ name: string }>;
    assert.deepEqual(fileList.map((k) => k.name).sort(), ['alice', 'bob']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await db.close();
  }
});

test('three gateways on one database: a revocation through the CLI is refused by all three within a second (worst of 20)', { timeout: 300_000 }, async () => {
  await withFleet(async (f) => {
    assert.equal((await runCli(['db', 'migrate'], f.env)).code, 0);
    const bases = (await Promise.all([0, 1, 2].map(() => f.gateway()))).map((g) => g.base);
    // The 20 keys in one statement (what the CLI writes: id, name, digest, created): the
    // revocations are what is measured, and a CLI run each for creating them doubled the
    // test's time on a loaded machine without adding to what it shows.
    const keys = Array.from({ length: 20 }, (_, i) => ({ id: `key_revoke${String(i).padStart(6, '0')}`, name: `k${i}`, token: generateToken() }));
    await f.db
      .admin`insert into keyward_keys ${f.db.admin(keys.map((k) => ({ id: k.id, name: k.name, digest: `sha256:${tokenDigest(k.token)}`, created: new Date() })))}`;
    await eventually(
      async () => (await Promise.all(keys.flatMap((k) => bases.map((b) => status(b, k.token))))).every((s) => s === 200),
      10_000,
      'the keys on every gateway',
    );
    const worst: number[] = [];
    const cli: number[] = [];
    for (const key of keys) {
      const commandStart = performance.now();
      const revoked = await runCli(['keys', 'revoke', key.name], f.env);
      assert.equal(revoked.code, 0);
      const at = performance.now();
      cli.push(at - commandStart);
      const times = await Promise.all(
        bases.map(async (b) => {
          await eventually(async () => (await status(b, key.token)) === 401, 1_000, 'revocation');
          return performance.now() - at;
        }),
      );
      worst.push(Math.max(...times));
    }
    const max = Math.max(...worst);
    console.log(
      `revocation reached all three gateways: worst of 20 ${max.toFixed(0)} ms, median ${[...worst].sort((a, b) => a - b)[10]?.toFixed(0)} ms after the CLI exited (the CLI itself took ${Math.min(...cli).toFixed(0)}–${Math.max(...cli).toFixed(0)} ms, process start included)`,
    );
    // The figure is printed for reading; the bound is one a loaded machine meets (the revocation path is measured, not asserted, in docs/fleet.md).
    assert.ok(max < 5_000, `worst ${max} ms`);
  });
});

test('a gateway whose database connections are killed picks up a revocation made meanwhile once it reconnects', { timeout: 60_000 }, async () => {
  await withFleet(async (f) => {
    const key = await f.key('cut');
    const base = (await f.gateway()).base;
    assert.equal(await status(base, key.token), 200);
    // Cut every connection but ours, then revoke while the gateway is not listening.
    await f.db.admin`select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and pid <> pg_backend_pid()`;
    await f.db.admin`update keyward_keys set revoked = now(), version = nextval('keyward_keys_version') where name = 'cut'`;
    const at = Date.now();
    await eventually(async () => (await status(base, key.token)) === 401, 10_000, 'revocation after reconnect');
    console.log(`revocation made while disconnected took effect ${Date.now() - at} ms later`);
    // And it is subscribed again: a key created now is taken up at once.
    const after = await f.key('after');
    await eventually(async () => (await status(base, after.token)) === 200, 1_000, 'new key after reconnect');
  });
});

test(
  'database down: the last good set serves (readyz stale, keystore_up 0) until KEYWARD_KEYS_MAX_STALENESS, then 503 keystore_unavailable; back up, fresh again',
  { timeout: 90_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream();
    const env = {
      KEYWARD_DATABASE_URL: db.url,
      KEYWARD_PORT: '0',
      KEYWARD_ADMIN_PORT: '0',
      KEYWARD_KEYS_MAX_STALENESS: '3s',
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
    };
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'stale', '--json'], env)).stdout) as { token: string };
    const gw = await startCli(['serve'], env, '"msg":"admin listening"');
    try {
      const base = `http://127.0.0.1:${portOf(gw.output(), 'keyward listening')}`;
      const admin = `http://127.0.0.1:${portOf(gw.output(), 'admin listening')}`;
      assert.equal(await status(base, key.token), 200);
      // Traffic throughout: every request is served, or refused with the stated 503.
      const seen = new Map<string, number>();
      let loading = true;
      const load = (async () => {
        while (loading) {
          // A network error is counted, not thrown, so that a failure names what was seen.
          const label = await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } }).then(
            (r) => (r.status === 200 ? '200' : `${r.status} ${(r.json() as { code: string }).code}`),
            (err: NodeJS.ErrnoException) => `network error ${err.code ?? err.message} at ${new Date().toISOString()}`,
          );
          seen.set(label, (seen.get(label) ?? 0) + 1);
        }
      })();
      await db.stop();
      await eventually(async () => ((await request(`${admin}/readyz`)).json() as { stale?: boolean }).stale === true, 5_000, 'stale');
      assert.equal((await request(`${admin}/readyz`)).status, 200);
      assert.equal(await status(base, key.token), 200, 'the last good set still serves');
      assert.match((await request(`${admin}/metrics`)).body.toString(), /^keyward_keystore_up 0$/m);
      await eventually(
        async () => (await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } })).status === 503,
        8_000,
        'stale beyond the limit',
      );
      const refused = await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } });
      assert.deepEqual(refused.json(), { error: 'No key set is available.', code: 'keystore_unavailable' });
      assert.equal((await request(`${admin}/readyz`)).status, 503);
      assert.equal(gw.output().split('"msg":"key store unreachable; serving the last good key set"').length - 1, 1, 'said once');
      await db.start();
      await eventually(async () => (await status(base, key.token)) === 200, 20_000, 'fresh again');
      await eventually(async () => /^keyward_keystore_up 1$/m.test((await request(`${admin}/metrics`)).body.toString()), 5_000, 'store up');
      loading = false;
      await load;
      assert.deepEqual(
        [...seen.keys()].sort(),
        ['200', '503 keystore_unavailable'],
        `nothing but served or refused as stated: ${JSON.stringify([...seen])}\n${gw
          .output()
          .split('\n')
          .filter((l) => !l.includes('"request completed"'))
          .join('\n')}`,
      );
      await eventually(() => gw.output().includes('"msg":"key store reachable again"'), 3_000, 'logged once back');
    } finally {
      gw.child.kill('SIGTERM');
      await deadline(gw.done, 10_000, 'exit');
      await up.close();
      await db.close();
    }
  },
);

test('a gateway started while the database is down answers 503 keystore_unavailable until it loads a set', { timeout: 60_000 }, async () => {
  const db = await startDatabase();
  const up = await startUpstream();
  const env = { KEYWARD_DATABASE_URL: db.url, KEYWARD_PORT: '0', KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p' };
  const key = JSON.parse((await runCli(['keys', 'create', '--name', 'late', '--json'], env)).stdout) as { token: string };
  await db.stop();
  const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
  try {
    const base = `http://127.0.0.1:${portOf(gw.output(), 'keyward listening')}`;
    const r = await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } });
    assert.equal(r.status, 503);
    assert.equal((r.json() as { code: string }).code, 'keystore_unavailable');
    await db.start();
    await eventually(async () => (await status(base, key.token)) === 200, 40_000, 'serves once the set is loaded');
  } finally {
    gw.child.kill('SIGTERM');
    await deadline(gw.done, 10_000, 'exit');
    await up.close();
    await db.close();
  }
});

// A scale check of the whole path (SQL rows → the gateway's set → one
// revocation); the figures at a million keys are a benchmark
// (`npm run bench:many-keys`, bench/README.md), not a bound asserted here.
test('100,000 keys: a gateway loads them, serves a new one, and one revocation reaches it', { timeout: 240_000 }, async () => {
  await withFleet(async (f) => {
    const r = await manyKeys(f, 100_000, 60_000);
    assert.equal(r.keys, 100_000);
    console.log(
      `100,000 keys from PostgreSQL: loaded in ${r.loadMs} ms, gateway RSS ${r.rssMb.toFixed(0)} MB, one revocation took effect ${r.revokeMs.toFixed(0)} ms after the CLI exited (the CLI took ${r.cliMs.toFixed(0)} ms)${r.note === '' ? '' : `\n${r.note}`}`,
    );
  });
});

test('after a PostgreSQL outage a gateway is back within about a second, and a change made then is in effect at once', { timeout: 90_000 }, async () => {
  await withFleet(async (f) => {
    const key = await f.key('outage');
    const gw = await f.gateway();
    assert.equal(await status(gw.base, key.token), 200);
    await f.db.stop();
    // Long enough for an exponential backoff to have grown to several seconds.
    await eventually(() => gw.output().includes('"msg":"key store unreachable; serving the last good key set"'), 5_000, 'noticed the outage');
    await new Promise((r) => setTimeout(r, 8_000));
    await f.db.start();
    const back = Date.now();
    // Revoked by SQL, as soon as the server answers: no CLI start-up in the measurement.
    await f.db.admin`update keyward_keys set revoked = now(), version = nextval('keyward_keys_version') where id = ${key.id}`;
    await f.db.admin`select pg_notify('keyward_keys', '{}')`;
    await eventually(async () => (await status(gw.base, key.token)) === 401, 10_000, 'revocation in effect');
    const took = Date.now() - back;
    console.log(`after an 8 s outage: a revocation made as the database came back was in effect ${took} ms later`);
    // The reconnect rule waits at most 1 s between attempts, then a full reload: about 1–2 s idle; a loaded machine gets room.
    assert.ok(took < 10_000, `in effect ${took} ms after the database was back`);
  });
});
