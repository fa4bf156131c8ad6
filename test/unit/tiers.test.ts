// test/README.md: every test file is in one tier of test/tiers.json, and a
// file of the fast tier starts nothing a fast run cannot afford (a spawned
// keyward, a real PostgreSQL, npm pack, a browser): a new file in neither
// tier, or a fast file that starts to spawn, fails here.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const tiers = JSON.parse(readFileSync(join(ROOT, 'test', 'tiers.json'), 'utf8')) as { fast: string[]; full: string[] };

/** Every *.test.ts under test/, as a path from the root. */
function testFiles(dir = 'test'): string[] {
  return readdirSync(join(ROOT, dir), { withFileTypes: true }).flatMap((e) =>
    e.isDirectory() ? testFiles(join(dir, e.name)) : e.name.endsWith('.test.ts') ? [join(dir, e.name)] : [],
  );
}

test('every test file is in exactly one tier, and every listed file exists', () => {
  const files = testFiles().sort();
  const listed = [...tiers.fast, ...tiers.full];
  for (const f of files) assert.equal(listed.filter((l) => l === f).length, 1, `${f}: in neither tier of test/tiers.json, or in both`);
  for (const l of listed) assert.ok(files.includes(l), `${l} is listed in test/tiers.json but does not exist`);
});

test('a fast file starts nothing but sockets and in-process parts', () => {
  const slow = /support\/(postgres|cli|fleet|install|platform)\.ts|playwright|node:child_process/;
  // This file names what it looks for, so it is not read for it.
  for (const f of tiers.fast.filter((t) => t !== 'test/unit/tiers.test.ts'))
    assert.doesNotMatch(readFileSync(join(ROOT, f), 'utf8'), slow, `${f} belongs in the full tier`);
});
