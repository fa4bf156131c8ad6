// Round 4, point 8's smaller findings that are not the admin API's
// (admin-api-round-4.test.ts has those): `keyward admins --help` printed
// "unknown admins command" and exited 2; `allowFrom: ["::/8"]` admitted
// every IPv4 client (it takes in ::ffff:0:0/96) and `fe80::1%lo` was
// accepted and never matched; after `kill -9` a writer's temporary copy of
// the keys file (0600, every digest) stayed behind for good.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { runCli } from '../support/cli.ts';
import { parseRange, rangeSet, inRanges } from '../../src/lib/addresses.ts';
import { allowFromProblem } from '../../src/keys/limits.ts';

test('keyward admins --help (and -h, help) prints its usage and exits 0', async () => {
  for (const flag of ['--help', '-h', 'help']) {
    const r = await runCli(['admins', flag], { KEYWARD_KEYS_FILE: join(tmpdir(), 'keyward-none', 'keys.json') });
    assert.equal(r.code, 0, `${flag}: ${r.stderr}`);
    assert.match(r.stdout, /^usage: keyward admins create/);
    assert.equal(r.stderr, '');
  }
});

test('allowFrom: an IPv6 range that takes in every IPv4 client and a zone id are refused; IPv6 and mapped single addresses stay', async () => {
  for (const range of ['::/8', '::/0', '::/80', '::ffff:0:0/96', '::ffff:0:0/95', 'fe80::1%lo', 'fe80::%eth0/64']) {
    assert.equal(parseRange(range), null, range);
    assert.notEqual(allowFromProblem([range]), null, range);
  }
  for (const range of ['2001:db8::/32', 'fe80::/10', '::1', '::ffff:10.0.0.0/104', '10.0.0.0/8']) assert.notEqual(parseRange(range), null, range);
  // What ::/8 would have done: every IPv4 address in it.
  const set = rangeSet(['2001:db8::/32']);
  assert.ok(set !== null && !inRanges(set, '203.0.113.9'));
  const dir = mkdtempSync(join(tmpdir(), 'keyward-allow-'));
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    for (const range of ['::/8', 'fe80::1%lo']) {
      const r = await runCli(['keys', 'create', '--name', 'k', '--allow-from', range], env);
      assert.equal(r.code, 2, `${range}: ${r.stdout}`);
      assert.match(r.stderr, /--allow-from must be/);
    }
    assert.equal((await runCli(['keys', 'create', '--name', 'k', '--allow-from', '2001:db8::/32'], env)).code, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a killed writer's temporary keys files are removed at the next start; a live writer's are left", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-tmp-'));
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    assert.equal((await runCli(['keys', 'create', '--name', 'k'], env)).code, 0);
    // A pid that was a process and is no more.
    const gone = spawnSync('true').pid;
    const dead = ['keys.json', 'keys.json.admins', 'keys.json.last-used'].map((f) => join(dir, `${f}.${gone}.0badc0de.tmp`));
    const live = join(dir, `keys.json.${process.pid}.0badc0de.tmp`);
    const other = join(dir, `notes.${gone}.0badc0de.tmp`);
    for (const f of [...dead, live, other]) writeFileSync(f, '{"version":1,"keys":[]}', { mode: 0o600 });
    const r = await runCli(['keys', 'list'], env);
    assert.equal(r.code, 0, r.stderr);
    for (const f of dead) assert.ok(!existsSync(f), `${f} removed`);
    assert.ok(existsSync(live), 'a running writer keeps its own');
    assert.ok(existsSync(other), 'files that are not the keys file’s are not touched');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
