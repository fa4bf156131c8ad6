// What a user configuring keyward for real runs into in the second hour:
// a misspelled variable is named with the one it most likely meant, and
// KEYWARD_STRICT_ENV=1 makes it a configuration error (docs/configuration.md).
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { runCli, startCli } from '../support/cli.ts';
import { deadline, eventually } from '../support/deadline.ts';

test('a misspelled KEYWARD_* variable is warned about with the closest known name; KEYWARD_STRICT_ENV=1 refuses to start', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-second-'));
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_PORT: '0', KEYWARD_SCRAPER_KEY: 'apify_api_x', KEYWARD_LISTEN_PORT: '41006', KEYWARD_DRAIN_TIMOUT: '3s' };
    const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
    try {
      await eventually(() => gw.output().split('"msg":"unknown variable').length === 4, 5_000, 'three warnings');
      const warnings = gw.output().split('\n').filter((l) => l.includes('"msg":"unknown variable')).map((l) => JSON.parse(l) as { level: number; msg: string });
      assert.deepEqual(warnings.map((w) => w.msg), [
        'unknown variable KEYWARD_DRAIN_TIMOUT; did you mean KEYWARD_DRAIN_TIMEOUT?',
        'unknown variable KEYWARD_LISTEN_PORT; did you mean KEYWARD_PORT?',
        'unknown variable KEYWARD_SCRAPER_KEY; did you mean KEYWARD_SCRAPER_TOKEN?',
      ]);
      assert.ok(warnings.every((w) => w.level === 40));
    } finally {
      gw.child.kill('SIGTERM');
      await deadline(gw.done, 10_000, 'exit');
    }
    const strict = await runCli(['serve'], { ...env, KEYWARD_STRICT_ENV: '1' });
    assert.equal(strict.code, 2);
    assert.match(strict.stderr, /unknown variable KEYWARD_SCRAPER_KEY; did you mean KEYWARD_SCRAPER_TOKEN\?/);
    // Known names, the config file's and the launcher's own, are not reported.
    const clean = await startCli(['serve'], { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: 'off', KEYWARD_ADMIN_HOST: '127.0.0.1', KEYWARD_STRICT_ENV: '1' }, '"msg":"keyward listening"');
    clean.child.kill('SIGTERM');
    const done = await deadline(clean.done, 10_000, 'exit');
    assert.equal(done.code, 0);
    assert.doesNotMatch(done.stdout, /unknown variable/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('start-up errors say what and where in one line: a port in use, a damaged keys file, a missing secret file, serve --port, every bad limit flag', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-second-'));
  const { createServer } = await import('node:net');
  const { writeFileSync } = await import('node:fs');
  const taken = createServer();
  await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
  const port = (taken.address() as { port: number }).port;
  try {
    const busy = await runCli(['serve'], { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_PORT: String(port) });
    assert.equal(busy.code, 1);
    assert.equal(busy.stderr, `keyward: cannot start: KEYWARD_PORT: 127.0.0.1:${port} is already in use (EADDRINUSE: another keyward?); set KEYWARD_PORT to a free port\n`, 'one line on stderr');
    const fatal = busy.stdout.split('\n').filter((l) => l.includes('"level":60'));
    assert.equal(fatal.length, 1);
    assert.doesNotMatch(fatal[0] as string, /stack|listen\.ts/, 'no stack for a failure the message explains');

    const damaged = join(dir, 'damaged.json');
    writeFileSync(damaged, '{"version":1,"keys":[\n{"id": }\n]}');
    const corrupt = await runCli(['serve'], { KEYWARD_KEYS_FILE: damaged, KEYWARD_PORT: '0' });
    assert.equal(corrupt.code, 1);
    assert.equal(corrupt.stderr, `keyward: cannot start: keys file ${damaged}: not valid JSON at line 2, column 8\n`);

    const missing = join(dir, 'no-such-secret');
    const secret = await runCli(['serve'], { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_PORT: '0', KEYWARD_SPEECH_KEY_FILE: missing });
    assert.equal(secret.code, 2);
    assert.match(secret.stderr, new RegExp(`KEYWARD_SPEECH_KEY_FILE: cannot read ${missing.replace(/[/.]/g, '\\$&')} \\(ENOENT\\)`));

    const flag = await runCli(['serve', '--port', '41001'], {});
    assert.equal(flag.code, 2);
    assert.match(flag.stderr, /serve takes no options; it is configured by environment variables \(--port: KEYWARD_PORT, e\.g\. KEYWARD_PORT=… keyward serve\)/);

    const limits = await runCli(['keys', 'create', '--name', 'x', '--rate', '10', '--quota', '5000', '--concurrency', 'many'], { KEYWARD_KEYS_FILE: join(dir, 'keys.json') });
    assert.equal(limits.code, 2);
    const first = limits.stderr.split('\n')[0] as string;
    for (const f of ['--rate', '--quota', '--concurrency']) assert.match(first, new RegExp(`${f} must be`), `${f} reported too`);
  } finally {
    taken.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
