// Round 4, point 3 (docs/cli.md, "Output"): `keyward audit --json | …`,
// `keyward keys export | …` and `keyward keys list --json | …` came out as
// exactly 65,536 bytes through a pipe with exit status 0, because the
// process exited before standard output had drained. Every command's output
// must reach a pipe whole, and a write error on standard output other than
// a reader that left (EPIPE) is exit status 1.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { BIN, childEnv, collect, runCli } from '../support/cli.ts';
import { deadline } from '../support/deadline.ts';
import { FileKeyStore } from '../../src/keys/file-store.ts';
import { importKeys } from '../../src/keys/manage.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';
import { generateToken, tokenDigest } from '../../src/keys/token.ts';
import type { KeyRecord } from '../../src/keys/keyset.ts';

/** `sh -c script` with the test's environment; its exit status and output. */
function sh(script: string, env: Record<string, string>): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn('bash', ['-o', 'pipefail', '-c', script], { env: { ...childEnv(env), KW: BIN }, stdio: ['ignore', 'pipe', 'pipe'] });
  return deadline(collect(child), 120_000, script);
}

test('output over 1 MiB reaches a slow pipe whole, as it reaches a file', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-pipe-'));
  const keysFile = join(dir, 'keys.json');
  const env = { KEYWARD_KEYS_FILE: keysFile };
  try {
    // Enough keys (and so audit entries) for each output to pass 1 MiB.
    const store = new FileKeyStore(keysFile, costRoutes(UPSTREAMS));
    const records: KeyRecord[] = [];
    for (let i = 0; i < 6000; i++) {
      const n = i.toString(16).padStart(12, '0');
      records.push({
        id: `key_${n}`,
        name: `client-${n}-with-a-longer-name-for-size`,
        digest: `sha256:${tokenDigest(generateToken())}`,
        created: '2026-11-01T00:00:00.000Z',
        expires: null,
        revoked: null,
      });
    }
    assert.equal(await importKeys(store, records), records.length);

    for (const command of ['audit --json', 'keys export', 'keys list --json']) {
      const toFile = join(dir, 'whole.out');
      const toPipe = join(dir, 'piped.out');
      const direct = await sh(`"$KW" ${command} > '${toFile}'`, env);
      assert.equal(direct.code, 0, `${command} to a file: ${direct.stderr}`);
      // The reader starts late: everything past the pipe's buffer is still queued when the command is done.
      const piped = await sh(`"$KW" ${command} | (sleep 1; cat > '${toPipe}')`, env);
      assert.equal(piped.code, 0, `${command} through a pipe: ${piped.stderr}`);
      const size = statSync(toFile).size;
      assert.ok(size > 1024 * 1024, `${command} wrote ${size} bytes; the test needs more than 1 MiB`);
      assert.equal(statSync(toPipe).size, size, `${command}: the pipe got every byte the file did`);
      assert.ok(readFileSync(toPipe).equals(readFileSync(toFile)), `${command}: the same bytes`);
    }

    // A reader that leaves early is its own choice: exit 0, as before.
    const head = await sh(`"$KW" keys list --json | head -c 100 > /dev/null`, env);
    assert.equal(head.code, 0, head.stderr);
    // Output that cannot be written is a failure the exit status carries.
    if (existsSync('/dev/full')) {
      const full = await runCliTo('/dev/full', ['keys', 'list', '--json'], env);
      assert.equal(full.code, 1, 'a write error on standard output is exit status 1');
      assert.match(full.stderr, /could not write the output/);
    }
    // A small command's exit status is unchanged by the wait.
    assert.equal((await runCli(['version'], env)).code, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

/** A command with its standard output opened on `path` (a device such as /dev/full). */
async function runCliTo(path: string, args: string[], env: Record<string, string>): Promise<{ code: number | null; stderr: string }> {
  const r = await sh(`"$KW" ${args.join(' ')} > ${path}`, env);
  return { code: r.code, stderr: r.stderr };
}
