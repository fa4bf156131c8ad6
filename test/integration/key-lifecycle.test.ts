// Key lifecycle (docs/keys.md): rotation with a grace period, scope and
// expiry updates, last use, idempotent revocation, and the CLI's strictness.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { runCli } from '../support/cli.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

interface Listed {
  id: string;
  name: string;
  routes: string[] | null;
  expires: string | null;
  revoked: string | null;
  lastUsed: string | null;
}

test('rotate: the new token works at once, the old one only for the grace period; rotation without grace stops it at once', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  const env = { KEYWARD_KEYS_FILE: gw.store.location };
  const status = async (token: string): Promise<number> => (await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status;
  try {
    // A grace long enough that a loaded machine's CLI and file poll still land inside it.
    const rotated = await runCli(['keys', 'rotate', 'tester', '--grace', '10s', '--json'], env);
    assert.equal(rotated.code, 0, rotated.stderr);
    const next = JSON.parse(rotated.stdout) as { id: string; name: string; token: string; graceUntil: string };
    assert.equal(next.id, gw.keyId, 'same key');
    assert.notEqual(next.token, gw.token);
    await eventually(async () => (await status(next.token)) === 200, 5_000, 'new token accepted');
    assert.ok(Date.now() < Date.parse(next.graceUntil), 'checked within the grace');
    assert.equal(await status(gw.token), 200, 'old token within its grace');
    await eventually(async () => (await status(gw.token)) === 401, 15_000, 'old token refused once the grace is over');
    assert.ok(Date.now() >= Date.parse(next.graceUntil) - 50, 'not before the grace ended');
    assert.equal(await status(next.token), 200);
    // The refusal of a rotated-out token names no key: the token no longer opens one.
    const again = JSON.parse((await runCli(['keys', 'rotate', gw.keyId, '--json'], env)).stdout) as { token: string };
    await eventually(async () => (await status(again.token)) === 200, 5_000, 'third token accepted');
    assert.equal(await status(next.token), 401, 'no grace: the previous token stops at once');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('update changes scope and expiry without changing the token; scope refusals are 403 forbidden and logged with the key', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, speech: up.url });
  const env = { KEYWARD_KEYS_FILE: gw.store.location };
  const get = (path: string): Promise<number> => request(`${gw.url}${path}`, { headers: { authorization: `Bearer ${gw.token}` } }).then((r) => r.status);
  try {
    assert.equal((await runCli(['keys', 'update', 'tester', '--routes', 'seo'], env)).code, 0);
    await eventually(async () => (await get('/speech/v1/voices')) === 403, 2_000, 'scope applied');
    const forwarded = up.requests.length;
    const refused = await request(`${gw.url}/speech/v1/voices`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.deepEqual(refused.json(), { error: 'This key may not use this route.', code: 'forbidden' });
    assert.equal(await get('/seo/v3/x'), 200);
    const line = gw.logs().find((l) => l.status === 403);
    assert.equal(line?.keyId, gw.keyId);
    assert.equal(line?.keyName, 'tester');
    assert.equal(up.requests.length, forwarded + 1, 'only the /seo request was forwarded');

    assert.equal((await runCli(['keys', 'update', 'tester', '--routes', 'all'], env)).code, 0);
    await eventually(async () => (await get('/speech/v1/voices')) === 200, 2_000, 'scope widened');
    assert.equal((await runCli(['keys', 'update', 'tester', '--expires-in', '1s'], env)).code, 0);
    await eventually(async () => (await get('/seo/v3/x')) === 401, 4_000, 'expired');
    const expired = gw
      .logs()
      .filter((l) => l.status === 401)
      .at(-1);
    assert.equal(expired?.keyId, gw.keyId, 'a refused known key is named in the log');
    assert.equal((await runCli(['keys', 'update', 'tester', '--expires-in', 'never'], env)).code, 0);
    await eventually(async () => (await get('/seo/v3/x')) === 200, 2_000, 'expiry lifted');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('keys list shows last use, written in batches; revoke is idempotent by id and by name and logged refusals name the key', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, lastUseFlushMs: 200 });
  const env = { KEYWARD_KEYS_FILE: gw.store.location };
  try {
    const other = await runCli(['keys', 'create', '--name', 'idle', '--routes', 'seo,speech', '--json'], env);
    assert.equal(other.code, 0);
    const before = Date.now();
    for (let i = 0; i < 20; i++) assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status, 200);
    let rows: Listed[] = [];
    await eventually(
      async () => {
        rows = JSON.parse((await runCli(['keys', 'list', '--json'], env)).stdout) as Listed[];
        return rows.find((r) => r.name === 'tester')?.lastUsed !== null;
      },
      5_000,
      'last use written',
    );
    const used = Date.parse(rows.find((r) => r.name === 'tester')?.lastUsed as string);
    assert.ok(used >= before - 1_000 && used <= Date.now());
    assert.equal(rows.find((r) => r.name === 'idle')?.lastUsed, null);
    assert.deepEqual(rows.find((r) => r.name === 'idle')?.routes, ['seo', 'speech']);
    const table = await runCli(['keys', 'list'], env);
    assert.match(table.stdout, /LAST USED/);
    assert.match(table.stdout, /seo,speech/);

    const first = await runCli(['keys', 'revoke', 'tester'], env);
    assert.equal(first.code, 0);
    assert.match(first.stdout, /^Revoked key /);
    for (const target of ['tester', gw.keyId]) {
      const again = await runCli(['keys', 'revoke', target], env);
      assert.equal(again.code, 0, target);
      assert.match(again.stdout, /was already revoked/);
    }
    await eventually(async () => (await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status === 401, 2_000, 'revoked');
    const line = gw
      .logs()
      .filter((l) => l.status === 401)
      .at(-1);
    assert.equal(line?.keyId, gw.keyId);
    assert.equal(line?.keyName, 'tester');
    assert.equal(line?.client, '127.0.0.1');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('the keys CLI is strict: repeated flags, unknown routes, expiry beyond ten years; --help on every command; every command names its store', async () => {
  const gw = await startGateway();
  const env = { KEYWARD_KEYS_FILE: gw.store.location };
  try {
    const cases: Array<[string[], RegExp]> = [
      [['keys', 'create', '--name', 'a', '--name', 'b'], /--name was given more than once/],
      [['keys', 'create', '--name', 'a', '--json', '--json'], /--json was given more than once/],
      [['keys', 'create', '--name', 'a', '--routes', 'seo,video'], /unknown route "video"/],
      [['keys', 'create', '--name', 'a', '--expires-in', '3653d'], /at most ten years/],
      [['keys', 'update', 'tester', '--expires-in', '20000d'], /at most ten years/],
      [['keys', 'update', 'tester'], /needs --routes, --expires-in or --external-id/],
      [['keys', 'rotate', 'tester', '--grace', '400d'], /--grace must be/],
      [['keys', 'rotate'], /needs ID or NAME/],
      [['keys', 'fly'], /unknown keys command fly/],
    ];
    for (const [args, reason] of cases) {
      const r = await runCli(args, env);
      assert.equal(r.code, 2, args.join(' '));
      assert.match(r.stderr, reason, args.join(' '));
    }
    for (const args of [
      ['--help'],
      ['serve', '--help'],
      ['demo', '--help'],
      ['keys', '--help'],
      ['keys', 'create', '--help'],
      ['keys', 'list', '--help'],
      ['keys', 'revoke', '--help'],
      ['keys', 'rotate', '-h'],
      ['keys', 'update', '--help'],
    ]) {
      const r = await runCli(args, env);
      assert.equal(r.code, 0, args.join(' '));
      assert.match(r.stdout, /^usage: keyward/, args.join(' '));
    }
    for (const args of [
      ['keys', 'list'],
      ['keys', 'create', '--name', 'named'],
      ['keys', 'rotate', 'named'],
      ['keys', 'update', 'named', '--routes', 'seo'],
      ['keys', 'revoke', 'named'],
    ]) {
      const r = await runCli(args, env);
      assert.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`);
      assert.equal(r.stderr.split('\n')[0], `keyward: keys file ${gw.store.location}`, args.join(' '));
    }
  } finally {
    await gw.close();
  }
});

test('rotate --json gives the last use keys list shows, not null', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, lastUseFlushMs: 50 });
  const env = { KEYWARD_KEYS_FILE: gw.store.location };
  try {
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status, 200);
    const listed = async (): Promise<Listed | undefined> =>
      (JSON.parse((await runCli(['keys', 'list', '--json'], env)).stdout) as Listed[]).find((k) => k.id === gw.keyId);
    await eventually(async () => (await listed())?.lastUsed !== null, 5_000, 'the last use written');
    const used = (await listed())?.lastUsed;
    const rotated = await runCli(['keys', 'rotate', gw.keyId, '--json'], env);
    assert.equal(rotated.code, 0, rotated.stderr);
    assert.equal((JSON.parse(rotated.stdout) as Listed).lastUsed, used);
  } finally {
    await gw.close();
    await up.close();
  }
});
