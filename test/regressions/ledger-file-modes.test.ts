// The usage ledger's files were 0644 under umask 022 while the keys file is
// 0600: who a key belongs to and what it spent is as private as the keys.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync, statSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { BIN, childEnv, collect, runCli } from '../support/cli.ts';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startUpstream } from '../support/upstream.ts';

test('under umask 022 the ledger and its -wal and -shm are 0600, as the keys file is', { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-modes-'));
  const up = await startUpstream();
  try {
    const env = {
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      KEYWARD_PORT: '0',
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'login-value',
      KEYWARD_SEO_PASSWORD: 'password-value',
      KEYWARD_USAGE_FLUSH: '100ms',
    };
    const { token } = JSON.parse((await runCli(['keys', 'create', '--name', 'm', '--json'], env)).stdout) as { token: string };
    const child = spawn('bash', ['-c', `umask 022 && exec ${BIN} serve`], { env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'] });
    const done = collect(child);
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await eventually(() => out.includes('"msg":"keyward listening"'), 20_000, 'listening');
    const port = (JSON.parse(out.split('\n').find((l) => l.includes('keyward listening')) as string) as { port: number }).port;
    assert.equal((await request(`http://127.0.0.1:${port}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status, 200);
    await eventually(() => readdirSync(dir).includes('keys.json.usage.sqlite-wal'), 5_000, 'the ledger written');
    const modes = Object.fromEntries(
      readdirSync(dir)
        .filter((n) => n.startsWith('keys.json'))
        .map((n) => [n, (statSync(join(dir, n)).mode & 0o777).toString(8)]),
    );
    child.kill('SIGTERM');
    await deadline(done, 10_000, 'exit');
    for (const f of ['keys.json', 'keys.json.usage.sqlite', 'keys.json.usage.sqlite-wal', 'keys.json.usage.sqlite-shm'])
      assert.equal(modes[f], '600', `${f}: ${JSON.stringify(modes)}`);
  } finally {
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
