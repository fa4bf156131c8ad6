// `keyward usage` (docs/cli.md): the ledger's rows as a table, JSON or CSV;
// the query and the report are views/usage-report.ts's, which the admin API
// shares (`GET /v1/usage`).
import { effectiveEnv, keysFilePath, storeConfig } from '../config/load.ts';
import { openKeyStore } from '../keys/open.ts';
import type { UpstreamSpec } from '../request/routes.ts';
import { usageQuery, writeUsage } from '../views/usage-report.ts';
import { helpTexts, parse, readText, type Io } from './args.ts';

export async function usageCommand(args: string[], io: Io, providers: readonly UpstreamSpec[]): Promise<number> {
  const help = helpTexts(providers).usage;
  const { values } = parse(
    args,
    {
      key: { type: 'string' },
      route: { type: 'string' },
      since: { type: 'string' },
      until: { type: 'string' },
      by: { type: 'string' },
      json: { type: 'boolean' },
      csv: { type: 'boolean' },
    },
    help,
  );
  const query = usageQuery(values, providers, help);
  const env = effectiveEnv(io.env, readText);
  const keysFile = keysFilePath(env, io.cwd);
  const keys = openKeyStore(storeConfig(env, io.cwd, readText, providers));
  try {
    return await writeUsage(query, keys, keysFile, providers, help, io);
  } finally {
    await keys.close?.();
  }
}
