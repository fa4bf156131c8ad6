// What `keyward keys create | list | revoke` does, over any KeyStore.
import { randomBytes } from 'node:crypto';
import type { KeyRecord } from './keyset.ts';
import type { KeyStore } from './store.ts';
import { generateToken, tokenDigest } from './token.ts';

export class KeyUsageError extends Error {
  override name = 'KeyUsageError';
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}$/;

export interface CreatedKey {
  readonly record: KeyRecord;
  /** Shown once, never stored. */
  readonly token: string;
}

export async function createKey(store: KeyStore, name: string, expiresInMs: number | null, now = Date.now()): Promise<CreatedKey> {
  if (!NAME.test(name)) {
    throw new KeyUsageError('--name must be 1-64 characters of letters, digits and . _ @ : - (starting with a letter or digit)');
  }
  const token = generateToken();
  const record: KeyRecord = {
    id: `key_${randomBytes(6).toString('hex')}`,
    name,
    digest: `sha256:${tokenDigest(token)}`,
    created: new Date(now).toISOString(),
    expires: expiresInMs === null ? null : new Date(now + expiresInMs).toISOString(),
    revoked: null,
  };
  await store.update((records) => {
    if (records.some((r) => r.name === name && r.revoked === null)) {
      throw new KeyUsageError(`a key named ${name} already exists; revoke it first or pick another name`);
    }
    return { records: [...records, record], result: undefined };
  });
  return { record, token };
}

export async function listKeys(store: KeyStore): Promise<readonly KeyRecord[]> {
  return store.load();
}

/** Revoke by id, or by the name of an active key. Revoking a revoked key changes nothing. */
export async function revokeKey(store: KeyStore, idOrName: string, now = Date.now()): Promise<KeyRecord> {
  return store.update((records) => {
    const target = records.find((r) => r.id === idOrName) ?? records.find((r) => r.name === idOrName && r.revoked === null);
    if (target === undefined) throw new KeyUsageError(`no key with id or name ${idOrName}`);
    if (target.revoked !== null) return { records, result: target };
    const revoked = { ...target, revoked: new Date(now).toISOString() };
    return { records: records.map((r) => (r === target ? revoked : r)), result: revoked };
  });
}
