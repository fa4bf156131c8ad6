// `keyward help config` (docs/cli.md): every option the configuration reads,
// from docs/configuration.md, which ships in the package.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { configHelp, readConfigHelp } from '../../src/cli/help-config.ts';
import { knownVariables } from '../../src/config/load.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';
import { runCli } from '../support/cli.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

test('help config names every option the configuration reads, with its default and form', async () => {
  const text = configHelp(readFileSync(`${ROOT}docs/configuration.md`, 'utf8'));
  const named = new Set([...text.matchAll(/^(KEYWARD_[A-Z0-9_]+)/gm)].flatMap((m) => m[0]));
  const listed = text.split('\n').flatMap((l) => (l.startsWith('KEYWARD_') ? l.split(', ') : []));
  for (const name of knownVariables(UPSTREAMS)) {
    if (name.endsWith('_FILE') && knownVariables(UPSTREAMS).includes(name.slice(0, -5))) continue;
    assert.ok(listed.includes(name) || named.has(name), name);
  }
  assert.match(text, /^KEYWARD_DRAIN_TIMEOUT\n {4}default: 30s; duration\n {4}on SIGTERM/m);
  const cli = await runCli(['help', 'config'], {});
  assert.equal(cli.code, 0, cli.stderr);
  assert.equal(cli.stdout, text);
  // Help names the options where people look first.
  const serve = await runCli(['serve', '--help'], {});
  assert.match(serve.stdout, /keyward help config[\s\S]*KEYWARD_PORT/);
  assert.match(
    readConfigHelp(() => {
      throw new Error('gone');
    }),
    /docs\/configuration\.md is missing/,
  );
});

test('the package ships docs/, which the README and help config point to', () => {
  const r = spawnSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], {
    cwd: ROOT,
    encoding: 'utf8',
    timeout: 60_000,
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  assert.equal(r.status, 0, r.stderr);
  const files = (JSON.parse(r.stdout) as Array<{ files: Array<{ path: string }> }>)[0]?.files.map((f) => f.path) ?? [];
  for (const doc of ['docs/configuration.md', 'docs/keys.md', 'docs/limits.md']) assert.ok(files.includes(doc), doc);
});
