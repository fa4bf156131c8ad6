// Round 4, point 7 (docs/keys.md, "Rolling back to 0.1.0"): keys written by
// this version with `allowFrom` or `runCap` made the previous release
// (40ab032, a 0.1.0 build from before key_unsupported) refuse to start on a
// keys file ("keys[0].limits.allowFrom is not a limit"), though the README
// promised a rollback by installing the previous tarball. `keyward keys
// export --for 0.1.0` writes a file that release serves, with every key it
// cannot enforce refused. The previous release itself runs here, from its
// own sources at that commit.
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { collect, listeningPort, runCli } from '../support/cli.ts';
import { deadline } from '../support/deadline.ts';
import { startUpstream } from '../support/upstream.ts';
import { generateToken, tokenDigest } from '../../src/keys/token.ts';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const PREVIOUS = '40ab032';

/** The previous release's sources at its commit, with this checkout's dependencies; null when the clone lacks that commit. */
function previousRelease(dir: string): string | null {
  if (spawnSync('git', ['-C', ROOT, 'cat-file', '-e', `${PREVIOUS}^{commit}`]).status !== 0) return null;
  const out = join(dir, 'previous');
  const r = spawnSync('sh', ['-c', `mkdir -p "$1" && git -C "$2" archive "$3" | tar -x -C "$1"`, 'sh', out, ROOT, PREVIOUS]);
  assert.equal(r.status, 0, r.stderr.toString());
  symlinkSync(join(ROOT, 'node_modules'), join(out, 'node_modules'));
  return join(out, 'bin', 'keyward');
}

/** `serve` of the previous release on `keysFile`, the seo route to `upstream`: its port, or its output when it would not start. */
async function servePrevious(bin: string, keysFile: string, upstream: string): Promise<{ port: number | null; output: string; stop: () => Promise<void> }> {
  // Not under this run's coverage: its sources are not this version's.
  const env = { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? '/', KEYWARD_FROM_SOURCE: '1', KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: 'off' };
  const child = spawn(bin, ['serve'], {
    env: { ...env, KEYWARD_KEYS_FILE: keysFile, KEYWARD_SEO_URL: upstream, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const done = collect(child);
  let output = '';
  // Listening (false) or exited (true), whichever comes first.
  const started = new Promise<boolean>((resolve) => {
    child.stdout?.on('data', (d: Buffer) => {
      output += d.toString();
      if (output.includes('"msg":"keyward listening"')) resolve(false);
    });
    void done.then(() => resolve(true));
  });
  const exited = await deadline(started, 35_000, 'the previous release starting or exiting');
  const stop = async (): Promise<void> => {
    child.kill('SIGTERM');
    await deadline(done, 15_000, 'the previous release stopping').catch(() => child.kill('SIGKILL'));
  };
  return { port: exited ? null : listeningPort(output), output: exited ? `${output}${(await done).stderr}` : output, stop };
}

test(
  'a keys file of this version, exported --for 0.1.0, is served by the previous release with every key it cannot enforce refused',
  { timeout: 170_000 },
  async (t) => {
    const dir = mkdtempSync(join(tmpdir(), 'keyward-rollback-'));
    const up = await startUpstream();
    try {
      const bin = previousRelease(dir);
      if (bin === null) {
        t.skip(`this clone does not hold ${PREVIOUS} (a shallow clone)`);
        return;
      }
      const keysFile = join(dir, 'keys.json');
      const env = { KEYWARD_KEYS_FILE: keysFile };
      const make = async (args: string[]): Promise<{ id: string; token: string }> => {
        const r = await runCli(['keys', 'create', ...args, '--json'], env);
        assert.equal(r.code, 0, r.stderr);
        return JSON.parse(r.stdout) as { id: string; token: string };
      };
      const plain = await make(['--name', 'plain', '--quota', '100/day', '--external-id', 'ext-plain']);
      const allowed = await make(['--name', 'allowed', '--allow-from', '127.0.0.1']);
      const capped = await make(['--name', 'capped', '--budget', 'scraper=5/day', '--run-cap', '1']);
      const gone = await make(['--name', 'gone', '--allow-from', '10.0.0.0/8']);
      assert.equal((await runCli(['keys', 'revoke', gone.id], env)).code, 0);
      // A key a newer version wrote, that requires a newer reader.
      const newer = generateToken();
      const text = readFileSync(keysFile, 'utf8').replace(
        '"keys":[\n',
        `"keys":[\n${JSON.stringify({ id: 'key_newer', name: 'newer', digest: `sha256:${tokenDigest(newer)}`, created: new Date().toISOString(), expires: null, revoked: null, requires: 2 })},\n`,
      );
      writeFileSync(keysFile, text, { mode: 0o600 });

      // The file as this version wrote it: the previous release will not start on it.
      const refusing = await servePrevious(bin, keysFile, up.url);
      await refusing.stop();
      assert.equal(refusing.port, null, 'the previous release refuses the file as it is');
      assert.match(refusing.output, /allowFrom is not a limit|runCap is not a limit/);

      // Exported for 0.1.0: served, with each key it cannot enforce refused and named.
      const exported = await runCli(['keys', 'export', '--for', '0.1.0'], env);
      assert.equal(exported.code, 0, exported.stderr);
      for (const id of [allowed.id, capped.id, 'key_newer'])
        assert.match(exported.stderr, new RegExp(`key ${id} \\(\\w+\\) is written revoked: 0\\.1\\.0 cannot enforce`));
      assert.doesNotMatch(exported.stderr, new RegExp(`key ${plain.id}|key ${gone.id}`), 'only keys that lose a rule are named');
      const rollback = join(dir, 'keys-0.1.0.json');
      writeFileSync(rollback, exported.stdout, { mode: 0o600 });
      assert.equal((await runCli(['keys', 'export', '--for', '0.0.9'], env)).code, 2, 'an unknown release is a usage error');

      const previous = await servePrevious(bin, rollback, up.url);
      try {
        assert.notEqual(previous.port, null, `the previous release serves the export: ${previous.output}`);
        const status = async (token: string): Promise<number> =>
          (await request(`http://127.0.0.1:${previous.port as number}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status;
        assert.equal(await status(plain.token), 200, 'a key it can enforce serves');
        for (const [name, token] of [
          ['allowFrom', allowed.token],
          ['runCap', capped.token],
          ['requires 2', newer],
          ['revoked', gone.token],
        ] as const)
          assert.equal(await status(token), 401, `${name}: refused, never opened without its rule`);
        assert.equal(up.requests.length, 1, 'only the plain key reached the upstream');
      } finally {
        await previous.stop();
      }
      // The original is untouched: this version still serves every key as before.
      assert.ok(
        !readFileSync(keysFile, 'utf8').includes('"revoked":"') || readFileSync(keysFile, 'utf8').split('"revoked":"').length === 2,
        'only the key revoked by the CLI is revoked in the original',
      );
    } finally {
      await up.close();
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
