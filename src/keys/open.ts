// The one place that chooses the key store: PostgreSQL with
// KEYWARD_DATABASE_URL, else the keys file. Everything else sees the seam.
import { FileKeyStore } from './file-store.ts';
import { PgKeyStore } from './pg-store.ts';
import type { KeyStore } from './store.ts';

/** What picks and opens the key store; `costRoutes`: the routes a key's budget may name (routes.ts). */
export interface StoreOptions {
  readonly databaseUrl: string | null;
  readonly databaseTimeoutMs?: number;
  readonly keysFile: string;
  readonly costRoutes: readonly string[];
}

export function openKeyStore(options: StoreOptions): KeyStore {
  return options.databaseUrl !== null
    ? new PgKeyStore(options.databaseUrl, options.costRoutes, options.databaseTimeoutMs)
    : new FileKeyStore(options.keysFile, options.costRoutes);
}
