// `keyward db migrate` (docs/fleet.md, schema).
import { effectiveEnv, storeConfig } from '../config/load.ts';
import { PgKeyStore } from '../keys/pg-store.ts';
import type { UpstreamSpec } from '../request/routes.ts';
import { EXIT_OK, helpTexts, HelpRequested, line, parse, readText, UsageError, type Io } from './args.ts';

export async function dbCommand(args: string[], io: Io, providers: readonly UpstreamSpec[]): Promise<number> {
  const HELP = helpTexts(providers);
  const [sub, ...rest] = args;
  if (sub === '--help' || sub === '-h') throw new HelpRequested(HELP.db);
  if (sub !== 'migrate') throw new UsageError(sub === undefined ? 'db needs migrate' : `unknown db command ${sub}`, HELP.db);
  parse(rest, {}, HELP.db);
  const { databaseUrl: url, costRoutes } = storeConfig(effectiveEnv(io.env, readText), io.cwd, readText, providers);
  if (url === null) throw new UsageError('db migrate needs KEYWARD_DATABASE_URL', HELP.db);
  const store = new PgKeyStore(url, costRoutes);
  try {
    line(io.stderr, `keyward: ${store.title}`);
    const { from, to } = await store.migrate();
    line(
      io.stdout,
      from === to
        ? `Database schema already at version ${to}; nothing to do.`
        : from === 0
          ? `Created keyward's tables (schema version ${to}).`
          : `Upgraded the database schema from version ${from} to ${to}.`,
    );
    return EXIT_OK;
  } finally {
    await store.close();
  }
}
