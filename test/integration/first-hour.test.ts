// What a new user meets in the first hour: every CLI message names the file
// or option it is about and says what to do, readiness means something, and
// ports in use name their option.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { freePort } from '../../src/process/listen.ts';
import { runCli, startCli } from '../support/cli.ts';
import { startUpstream } from '../support/upstream.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'keyward-first-'));
}

const portOf = (out: string, msg: string): number => (JSON.parse(out.split('\n').find((l) => l.includes(`"msg":"${msg}"`)) as string) as { port: number }).port;

test('keys list in a folder that does not exist is an error naming the folder', async () => {
  const dir = tempDir();
  try {
    const missing = join(dir, 'nowhere', 'keys.json');
    const r = await runCli(['keys', 'list'], { KEYWARD_KEYS_FILE: missing });
    assert.equal(r.code, 1);
    assert.match(r.stderr, new RegExp(`the folder ${join(dir, 'nowhere').replace(/[/.]/g, '\\$&')} does not exist; create it first`));
    assert.equal(r.stdout, '');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('keys rotate --json without --grace says the old token stopped (graceUntil null), even after an earlier graced rotation', async () => {
  const dir = tempDir();
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    assert.equal((await runCli(['keys', 'create', '--name', 'r'], env)).code, 0);
    const graced = JSON.parse((await runCli(['keys', 'rotate', 'r', '--grace', '1h', '--json'], env)).stdout) as { graceUntil: string | null };
    assert.ok(graced.graceUntil !== null && Math.abs(Date.parse(graced.graceUntil) - Date.now() - 3_600_000) < 60_000);
    const now = JSON.parse((await runCli(['keys', 'rotate', 'r', '--json'], env)).stdout) as { graceUntil: string | null };
    assert.equal(now.graceUntil, null);
    const text = await runCli(['keys', 'rotate', 'r'], env);
    assert.match(text.stdout, /the old token stopped working/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('keys import: a missing or corrupt FILE is named, and the store is left alone', async () => {
  const dir = tempDir();
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const missing = join(dir, 'backup.json');
    const r1 = await runCli(['keys', 'import', missing], env);
    assert.equal(r1.code, 2);
    assert.equal(r1.stderr, `keyward: keys import: cannot read ${missing} (no such file); give the path of a keys file, such as one written by keys export\n`);
    writeFileSync(missing, '{broken');
    const r2 = await runCli(['keys', 'import', missing], env);
    assert.equal(r2.code, 2);
    assert.equal(
      r2.stderr,
      `keyward: keys import: ${missing} is not a keys file (not valid JSON at line 1, column 2); give a file written by keys export or a gateway's keys.json\n`,
    );
    assert.throws(() => readFileSync(env.KEYWARD_KEYS_FILE), /ENOENT/, 'the store was not touched');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('keyward keys without a command lists every keys command; usage errors never print the store line', async () => {
  const dir = tempDir();
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const bare = await runCli(['keys'], env);
    assert.equal(bare.code, 2);
    for (const c of ['create', 'list', 'revoke', 'rotate', 'update', 'import', 'export'])
      assert.match(bare.stderr.split('\n')[0] as string, new RegExp(`\\b${c}\\b`), c);
    const usage: string[][] = [
      ['keys', 'create'],
      ['keys', 'create', '--name', 'x', '--expires-in', 'soon'],
      ['keys', 'revoke'],
      ['keys', 'rotate'],
      ['keys', 'rotate', 'x', '--grace', 'later'],
      ['keys', 'update', 'x'],
      ['keys', 'update'],
      ['keys', 'import'],
      ['keys', 'list', 'extra'],
    ];
    for (const args of usage) {
      const r = await runCli(args, env);
      assert.equal(r.code, 2, args.join(' '));
      assert.doesNotMatch(r.stderr, /keys file \//, `${args.join(' ')}: ${r.stderr}`);
      assert.match(r.stderr, /^keyward: /, args.join(' '));
    }
    // A command that reaches the store names it first, always.
    const ok = await runCli(['keys', 'list'], env);
    assert.equal(ok.stderr.split('\n')[0], `keyward: keys file ${env.KEYWARD_KEYS_FILE}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('readiness: 503 with a reason while no route is configured or no key exists; the start-up line warns', { timeout: 60_000 }, async () => {
  const dir = tempDir();
  const up = await startUpstream();
  try {
    const base = { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: '0' };
    const bare = await startCli(['serve'], base, '"msg":"admin listening"');
    try {
      const ready = await request(`http://127.0.0.1:${portOf(bare.output(), 'admin listening')}/readyz`);
      assert.equal(ready.status, 503);
      assert.match((ready.json() as { reason: string }).reason, /^no route is configured: set the upstream secrets/);
      const warn = bare
        .output()
        .split('\n')
        .find((l) => l.includes('nothing to serve yet'));
      assert.ok(warn !== undefined, bare.output());
      assert.equal((JSON.parse(warn) as { level: number }).level, 40);
      assert.match(bare.output(), new RegExp(`"keyStore":"${base.KEYWARD_KEYS_FILE.replace(/[/.]/g, '\\$&')}"`));
      assert.doesNotMatch(bare.output(), /"keysFile"/);
    } finally {
      bare.child.kill('SIGTERM');
      await deadline(bare.done, 10_000, 'exit');
    }
    const routed = { ...base, KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p' };
    const nokeys = await startCli(['serve'], routed, '"msg":"admin listening"');
    try {
      const admin = `http://127.0.0.1:${portOf(nokeys.output(), 'admin listening')}`;
      const ready = await request(`${admin}/readyz`);
      assert.equal(ready.status, 503);
      assert.match((ready.json() as { reason: string }).reason, /^no active key: create one with keyward keys create/);
      assert.equal((await runCli(['keys', 'create', '--name', 'first'], routed)).code, 0);
      // The keys file is watched: the first key makes the gateway ready, no restart.
      const until = Date.now() + 5_000;
      let status = 0;
      while (Date.now() < until && (status = (await request(`${admin}/readyz`)).status) !== 200) await new Promise((r) => setTimeout(r, 50));
      assert.equal(status, 200);
    } finally {
      nokeys.child.kill('SIGTERM');
      await deadline(nokeys.done, 10_000, 'exit');
    }
  } finally {
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a port in use names the option that chose it: KEYWARD_PORT, KEYWARD_ADMIN_PORT, and the demo's KEYWARD_PORT", { timeout: 60_000 }, async () => {
  const dir = tempDir();
  const busy = net.createServer();
  await new Promise<void>((r) => busy.listen(0, '127.0.0.1', r));
  const taken = String((busy.address() as AddressInfo).port);
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const pub = await runCli(['serve'], { ...env, KEYWARD_PORT: taken, KEYWARD_ADMIN_PORT: '0' });
    assert.equal(pub.code, 1);
    // Nothing says listening before every port is bound, and nothing drains what never served.
    assert.doesNotMatch(pub.stdout, /"msg":"(keyward listening|admin listening|draining|stopped)"/);
    assert.match(
      pub.stderr,
      new RegExp(`KEYWARD_PORT: 127\\.0\\.0\\.1:${taken} is already in use \\(EADDRINUSE: another keyward\\?\\); set KEYWARD_PORT to a free port`),
    );
    const admin = await runCli(['serve'], { ...env, KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: taken });
    assert.equal(admin.code, 1);
    assert.doesNotMatch(admin.stdout, /"msg":"(keyward listening|admin listening|draining|stopped)"/);
    assert.match(
      admin.stderr,
      new RegExp(`KEYWARD_ADMIN_PORT: 127\\.0\\.0\\.1:${taken} is already in use \\(EADDRINUSE: another keyward\\?\\); set KEYWARD_ADMIN_PORT to a free port`),
    );
    // A demo that cannot start leaves nothing behind: its temporary folder goes with it.
    const tmp = join(dir, 'tmp');
    mkdirSync(tmp);
    const demo = await runCli(['demo'], { KEYWARD_PORT: taken, TMPDIR: tmp });
    assert.equal(demo.code, 1);
    assert.match(demo.stderr, /KEYWARD_PORT: .* is already in use/);
    assert.doesNotMatch(demo.stderr, /"msg":"(keyward listening|draining|stopped)"/);
    const badPort = await runCli(['demo'], { KEYWARD_PORT: 'eighty', TMPDIR: tmp });
    assert.equal(badPort.code, 2);
    assert.deepEqual(
      readdirSync(tmp).filter((f) => f.startsWith('keyward-demo-')),
      [],
    );
  } finally {
    busy.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  "a keys file that stops parsing is logged with the error's type and message (pino's err serializer), and readiness and keyward_keystore_up say so until it parses again",
  { timeout: 30_000 },
  async () => {
    const dir = tempDir();
    try {
      const admin = await freePort();
      const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: String(admin), KEYWARD_SPEECH_KEY: 'xi-test' };
      assert.equal((await runCli(['keys', 'create', '--name', 'a'], env)).code, 0);
      const good = readFileSync(env.KEYWARD_KEYS_FILE, 'utf8');
      const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
      const readyz = async (): Promise<{ status: number; body: Record<string, unknown> }> => {
        const r = await request(`http://127.0.0.1:${admin}/readyz`);
        return { status: r.status, body: JSON.parse(r.body.toString()) as Record<string, unknown> };
      };
      const up = async (): Promise<string | undefined> =>
        /^keyward_keystore_up (\d)$/m.exec((await request(`http://127.0.0.1:${admin}/metrics`)).body.toString())?.[1];
      try {
        await eventually(async () => (await readyz()).status === 200, 5_000, 'ready');
        assert.equal((await readyz()).body.stale, undefined);
        assert.equal(await up(), '1');
        // Replaced whole (as an editor saves): written in place, the watcher may read it empty, half written.
        const replace = (text: string): void => {
          writeFileSync(`${env.KEYWARD_KEYS_FILE}.new`, text);
          renameSync(`${env.KEYWARD_KEYS_FILE}.new`, env.KEYWARD_KEYS_FILE);
        };
        replace('{broken');
        const until = Date.now() + 5_000;
        while (Date.now() < until && !gw.output().includes('keys not reloaded')) await new Promise((r) => setTimeout(r, 20));
        const line = JSON.parse(
          gw
            .output()
            .split('\n')
            .find((l) => l.includes('keys not reloaded')) as string,
        ) as { err: { type: string; message: string }; keyStore: string };
        assert.equal(line.err.type, 'KeysFileCorrupt');
        assert.equal(line.err.message, 'not valid JSON at line 1, column 2');
        assert.equal(line.keyStore, env.KEYWARD_KEYS_FILE);
        // Still serving its last good set, saying the file is broken, and not ready: a revocation in it is not in force.
        const broken = await readyz();
        assert.equal(broken.status, 503);
        assert.equal(broken.body.reason, 'keys file cannot be applied');
        assert.equal(broken.body.stale, true);
        assert.equal(
          broken.body.problem,
          `keys file ${env.KEYWARD_KEYS_FILE} cannot be read (not valid JSON at line 1, column 2); serving the last good key set`,
        );
        assert.equal(await up(), '0');
        replace(good);
        await eventually(async () => (await up()) === '1', 5_000, 'the fixed file in force');
        assert.equal((await readyz()).body.problem, undefined);
        assert.equal((await readyz()).status, 200);
      } finally {
        gw.child.kill('SIGTERM');
        await deadline(gw.done, 10_000, 'exit');
      }
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);

test(".gitignore covers what npm pack, the keys file, the ledger and the README's walkthroughs leave in a checkout", async () => {
  const names = [
    'keyward-0.2.0.tgz',
    'keys.json.last-used',
    'keys.json.corrupt-2026-01-01T00-00-00-000Z',
    'keys.json',
    'keys.json.lock',
    'keyward-dev-db/dev-db.json',
    'keys.json.usage.sqlite',
    'keys.json.usage-unwritten.123-abc.json',
    'credentials/speech_key',
    'fleet-db/dev-db.json',
    'fleet-db.env',
    'gw1.log',
    'gw2.log',
  ];
  const { stdout } = await promisify(execFile)('git', ['check-ignore', '--no-index', ...names], { cwd: ROOT });
  assert.deepEqual(stdout.trim().split('\n'), names);
});
