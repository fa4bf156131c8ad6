// Admin tokens (docs/admin-api.md, "Admin tokens"): who may call the admin
// API, kept as digests in the same store as the keys (beside the keys file,
// or PostgreSQL) and changed under the same lock, with an audit entry each.
// What `keyward admins …` and the API's token check do, over any KeyStore;
// the record itself is admin-record.ts.
import { randomBytes } from 'node:crypto';
import { ADMIN_ROLES, type AdminRecord, type AdminRole } from './admin-record.ts';
import { byIdOrName, checkName, KeyUsageError } from './manage.ts';
import type { KeyStore, UpdateOptions } from './store.ts';
import { generateAdminToken, isWellFormedAdmin, sameText, tokenDigest } from './token.ts';

export async function createAdmin(
  store: KeyStore,
  name: string,
  role: AdminRole,
  now = Date.now(),
  update: UpdateOptions = {},
): Promise<{ record: AdminRecord; token: string }> {
  checkName(name);
  if (!ADMIN_ROLES.includes(role)) throw new KeyUsageError('--role must be read or write');
  const token = generateAdminToken();
  const record: AdminRecord = {
    id: `adm_${randomBytes(6).toString('hex')}`,
    name,
    role,
    digest: `sha256:${tokenDigest(token)}`,
    created: new Date(now).toISOString(),
    revoked: null,
  };
  await store.updateAdmins((admins) => {
    if (admins.some((a) => a.name === name && a.revoked === null)) throw new KeyUsageError(`an admin token named ${name} already exists; revoke it first`);
    return { admins: [...admins, record], result: undefined };
  }, update);
  return { record, token };
}

/** Revoke by id or name; revoking a revoked token changes nothing. */
export async function revokeAdmin(
  store: KeyStore,
  idOrName: string,
  now = Date.now(),
  update: UpdateOptions = {},
): Promise<{ record: AdminRecord; already: boolean }> {
  return store.updateAdmins<{ record: AdminRecord; already: boolean }>((admins) => {
    const target = byIdOrName(admins, idOrName);
    if (target === null) throw new KeyUsageError(`no admin token with id or name ${idOrName}`);
    if (target.revoked !== null) return { admins, result: { record: target, already: true } };
    const revoked: AdminRecord = { ...target, revoked: new Date(now).toISOString() };
    return { admins: admins.map((a) => (a === target ? revoked : a)), result: { record: revoked, already: false } };
  }, update);
}

/**
 * The active admin whose token this is, or null. Every stored digest is
 * compared in full (sameText), so the time taken says nothing of how close
 * a guess came (docs/authentication.md); the list is short.
 */
export function adminFor(admins: readonly AdminRecord[], token: string): AdminRecord | null {
  if (!isWellFormedAdmin(token)) return null;
  const digest = `sha256:${tokenDigest(token)}`;
  let found: AdminRecord | null = null;
  for (const a of admins) if (sameText(a.digest, digest) && a.revoked === null) found = a;
  return found;
}

/** An admin as listed and answered: never its digest. */
export function adminView(a: AdminRecord): Omit<AdminRecord, 'digest'> {
  return { id: a.id, name: a.name, role: a.role, created: a.created, revoked: a.revoked };
}
