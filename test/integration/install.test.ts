// The production install (README "Install as a service"): `npm pack` makes
// an artifact that installs with --omit=dev (no compiler, the built dist/,
// Node 24 from the optional `node` package) and runs `keyward serve`; a Node
// too old gets one line saying so and how to fix it.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { childEnv, collect, runCli } from '../support/cli.ts';

const exec = promisify(execFile);
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

test('npm pack → npm install --omit=dev → keyward serve, with no compiler installed', { timeout: 240_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-install-'));
  try {
    await exec('npm', ['pack', '--pack-destination', dir], { cwd: ROOT, timeout: 120_000 });
    const tarball = readdirSync(dir).find((f) => f.endsWith('.tgz')) as string;
    const prefix = join(dir, 'opt');
    await exec('mkdir', ['-p', prefix]);
    await exec('npm', ['install', '--omit=dev', '--no-audit', '--no-fund', '--prefer-offline', join(dir, tarball)], { cwd: prefix, timeout: 180_000 });
    const mods = join(prefix, 'node_modules');
    assert.equal(existsSync(join(mods, 'typescript')), false, 'no compiler');
    assert.equal(existsSync(join(mods, 'keyward', 'src')), false, 'the package ships the build, not the sources');
    assert.equal(existsSync(join(mods, 'keyward', 'dist', 'main.js')), true);
    const bin = join(mods, '.bin', 'keyward');
    const env = { ...childEnv({}), NODE_OPTIONS: '', KEYWARD_FROM_SOURCE: '', KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: '0', KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const created = await exec(bin, ['keys', 'create', '--name', 'ops', '--json'], { env });
    const key = JSON.parse(created.stdout) as { token: string };
    const child = spawn(bin, ['serve'], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    const done = collect(child);
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    try {
      await eventually(() => out.includes('"msg":"admin listening"'), 15_000, 'listening');
      const port = (m: string): number => (JSON.parse(out.split('\n').find((l) => l.includes(m)) as string) as { port: number }).port;
      // Nothing to forward yet: not ready, and the reason says what to set.
      const ready = await request(`http://127.0.0.1:${port('admin listening')}/readyz`);
      assert.equal(ready.status, 503);
      assert.match((ready.json() as { reason: string }).reason, /^no route is configured: set the upstream secrets \(KEYWARD_SCRAPER_TOKEN/);
      // The route has no credential in this bare install: the gateway says so, after checking the token.
      const r = await request(`http://127.0.0.1:${port('keyward listening')}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } });
      assert.equal(r.status, 503);
      assert.equal((r.json() as { code: string }).code, 'route_not_configured');
    } finally {
      child.kill('SIGTERM');
      assert.equal((await deadline(done, 10_000, 'exit')).code, 0);
    }
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a Node.js too old for keyward is named in one line with the fix', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-oldnode-'));
  try {
    const fake = join(dir, 'node');
    writeFileSync(fake, '#!/bin/sh\necho v20.20.2\n');
    chmodSync(fake, 0o755);
    const r = await runCli(['serve'], { KEYWARD_NODE: fake });
    assert.equal(r.code, 1);
    assert.equal(r.stderr.trim().split('\n').length, 1);
    assert.match(r.stderr, /^keyward: Node\.js v20\.20\.2 .* is too old; keyward needs Node\.js 22\.18 or later\. Run 'npm ci'/);
    const missing = await runCli(['serve'], { KEYWARD_NODE: join(dir, 'nothing-here') });
    assert.equal(missing.code, 1);
    assert.match(missing.stderr, /^keyward: no Node\.js found/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
