// The keys file under faults (docs/keys.md): a writer killed at any moment
// leaves the old or the new file, whole; a corrupt file is never loaded and
// never written over without --force.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { parseKeysFile, serialiseKeysFile } from '../../src/keys/file-store.ts';
import type { KeyRecord } from '../../src/keys/keyset.ts';
import { BIN, childEnv, collect, runCli } from '../support/cli.ts';
import { deadline } from '../support/deadline.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';

function bigKeySet(n: number): KeyRecord[] {
  return Array.from({ length: n }, (_, i) => ({
    id: `key_${i.toString(16).padStart(12, '0')}`,
    name: `client-${i}`,
    digest: `sha256:${randomBytes(32).toString('hex')}`,
    created: '2026-01-01T00:00:00.000Z',
    expires: null,
    revoked: null,
  }));
}

test('a keys CLI killed at any moment leaves the old or the new file, whole; the next writer is not blocked', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-kill-'));
  const file = join(dir, 'keys.json');
  try {
    // Large enough that reading, writing and syncing take a while: kills land in every phase.
    let expected = bigKeySet(50_000);
    writeFileSync(file, serialiseKeysFile(expected));
    const outcomes = { old: 0, new: 0 };
    for (let i = 0; i < 16; i++) {
      const child = spawn(BIN, ['keys', 'create', '--name', `victim-${i}`], { env: childEnv({ KEYWARD_KEYS_FILE: file }), stdio: ['ignore', 'pipe', 'pipe'] });
      const done = collect(child);
      await new Promise((r) => setTimeout(r, 40 * i));
      child.kill('SIGKILL');
      await deadline(done, 10_000, 'killed writer gone');
      const now = parseKeysFile(readFileSync(file, 'utf8'), costRoutes(UPSTREAMS)); // whole, or this throws
      assert.deepEqual(
        now.slice(0, expected.length).map((r) => r.id),
        expected.map((r) => r.id),
        'no earlier key lost',
      );
      if (now.length === expected.length) outcomes.old++;
      else {
        assert.equal(now.length, expected.length + 1);
        assert.equal(now.at(-1)?.name, `victim-${i}`);
        outcomes.new++;
        expected = now;
      }
    }
    // A lock left by a killed writer is cleared (its process is gone): the next write goes through.
    const after = await runCli(['keys', 'create', '--name', 'survivor'], { KEYWARD_KEYS_FILE: file }, undefined, 30_000);
    assert.equal(after.code, 0, after.stderr);
    // Every write that reached the disk is still there, after every later kill: the file holds the
    // starting keys, one per writer that got through, and the survivor.
    assert.equal(parseKeysFile(readFileSync(file, 'utf8'), costRoutes(UPSTREAMS)).length, 50_000 + outcomes.new + 1);
    console.log(`killed writers: ${outcomes.old} left the old file, ${outcomes.new} the new one`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a corrupt keys file is not written over unless --force, which keeps the bad file beside the new one', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-corrupt-'));
  const file = join(dir, 'keys.json');
  try {
    writeFileSync(file, '{"version":1,"keys":[{"id":');
    for (const args of [
      ['keys', 'create', '--name', 'a'],
      ['keys', 'revoke', 'a'],
      ['keys', 'rotate', 'a'],
      ['keys', 'update', 'a', '--routes', 'seo'],
    ]) {
      const r = await runCli(args, { KEYWARD_KEYS_FILE: file });
      assert.equal(r.code, 1, args.join(' '));
      assert.match(r.stderr, /keys file: not valid JSON at line 1, column 28; nothing was changed \(--force replaces the file/);
      assert.equal(readFileSync(file, 'utf8'), '{"version":1,"keys":[{"id":');
    }
    const forced = await runCli(['keys', 'create', '--name', 'fresh', '--force'], { KEYWARD_KEYS_FILE: file });
    assert.equal(forced.code, 0, forced.stderr);
    assert.match(forced.stderr, /the unreadable keys file was moved to .*keys\.json\.corrupt-/);
    assert.deepEqual(
      parseKeysFile(readFileSync(file, 'utf8'), costRoutes(UPSTREAMS)).map((r) => r.name),
      ['fresh'],
    );
    const aside = readdirSync(dir).find((f) => f.startsWith('keys.json.corrupt-')) as string;
    assert.equal(readFileSync(join(dir, aside), 'utf8'), '{"version":1,"keys":[{"id":');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a keys file in a folder that does not exist is an error naming the folder, not a silent mkdir', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-nofolder-'));
  try {
    const file = join(dir, 'missing', 'keys.json');
    const r = await runCli(['keys', 'create', '--name', 'a'], { KEYWARD_KEYS_FILE: file });
    assert.equal(r.code, 1);
    assert.match(r.stderr, new RegExp(`the folder ${join(dir, 'missing').replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} does not exist`));
    assert.equal(existsSync(join(dir, 'missing')), false);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
