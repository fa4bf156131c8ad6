// bin/keyward on a Node too old gets one line saying so and how to fix it.
// The production install itself (`npm pack`, `npm install --omit=dev`, then
// `keyward serve` with no compiler) is followed as the README writes it, in
// readme.test.ts, and checked by serveInstalled (support/install.ts).
import assert from 'node:assert/strict';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { runCli } from '../support/cli.ts';

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

// bin/keyward, "young collections for a stream's chunks": Node 24's V8
// collects a stream's chunk Buffers with full collections unless told;
// Node 22's refuses nothing it does not know, so it is told only on 24.
test('the launcher gives Node 24 the young-collection setting for streamed chunks, and Node 22 none', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-flags-'));
  try {
    const fakeNode = (version: string): string => {
      const path = join(dir, `node-${version}`);
      writeFileSync(path, `#!/bin/sh\nif [ "$1" = "--version" ]; then echo ${version}; exit 0; fi\necho "ARGS $*"\n`);
      chmodSync(path, 0o755);
      return path;
    };
    const on24 = await runCli(['serve'], { KEYWARD_NODE: fakeNode('v24.9.0') });
    assert.equal(on24.code, 0, on24.stderr);
    assert.match(on24.stdout, /^ARGS .*--max-semi-space-size=4 .*--scavenger-max-new-space-capacity-mb=4 .*src\/main\.ts serve$/m);
    const on22 = await runCli(['serve'], { KEYWARD_NODE: fakeNode('v22.18.0') });
    assert.equal(on22.code, 0, on22.stderr);
    assert.match(on22.stdout, /^ARGS .*--max-semi-space-size=4 /m);
    assert.doesNotMatch(on22.stdout, /scavenger/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
