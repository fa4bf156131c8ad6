// The one place that chooses the key store: PostgreSQL with
// KEYWARD_DATABASE_URL, else the keys file. Everything else sees the seam.
import { FileKeyStore } from './file-store.ts';
import { PgKeyStore } from './pg-store.ts';
import type { KeyStore } from './store.ts';

export function openKeyStore(options: { readonly databaseUrl: string | null; readonly databaseTimeoutMs?: number; readonly keysFile: string }): KeyStore {
  return options.databaseUrl !== null ? new PgKeyStore(options.databaseUrl, options.databaseTimeoutMs) : new FileKeyStore(options.keysFile);
}
