// What a production install (`npm install --omit=dev` of the packed
// artifact) must hold and do: the build and not the sources, no compiler,
// and a `keyward serve` that starts, says what is missing, and drains.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { request } from './client.ts';
import { childEnv, collect } from './cli.ts';
import { deadline, eventually } from './deadline.ts';

const exec = promisify(execFile);

/** `mods`: the install's node_modules; `dir`: a folder for its keys file; `node`: the Node to run it with when the install has none of its own. */
export async function serveInstalled(mods: string, dir: string, node: string): Promise<void> {
  assert.equal(existsSync(join(mods, 'typescript')), false, 'no compiler');
  assert.equal(existsSync(join(mods, 'keyward', 'src')), false, 'the package ships the build, not the sources');
  assert.equal(existsSync(join(mods, 'keyward', 'dist', 'main.js')), true);
  // The runtime dependencies came inside the artifact.
  for (const dep of ['http-proxy-3', 'pino', 'postgres', 'prom-client', 'sonic-boom'])
    assert.equal(existsSync(join(mods, 'keyward', 'node_modules', dep, 'package.json')), true, `${dep} bundled`);
  const bin = join(mods, '.bin', 'keyward');
  const env = {
    ...childEnv({}),
    NODE_OPTIONS: '',
    KEYWARD_FROM_SOURCE: '',
    KEYWARD_PORT: '0',
    KEYWARD_ADMIN_PORT: '0',
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    ...(existsSync(join(mods, 'node', 'bin', 'node')) ? {} : { KEYWARD_NODE: node }),
  };
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
}
