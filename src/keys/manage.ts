// What `keyward keys …` does, over any KeyStore (docs/cli.md, keys.md).
import { randomBytes } from 'node:crypto';
import type { Limits } from './limits.ts';
import type { KeyRecord } from './keyset.ts';
import type { KeyStore, UpdateOptions } from './store.ts';
import { generateToken, tokenDigest } from './token.ts';
import { EXTERNAL_ID } from './record.ts';

/** A key operation refused for what it asked (a name taken, an unknown key): exit 2. */
export class KeyUsageError extends Error {
  override name = 'KeyUsageError';
  readonly code = 'KEYWARD_ERR_KEY_USAGE';
}

/** A key operation refused because another key holds what it asked for (an external id): 409 over HTTP, with that key's id. */
export class KeyConflict extends KeyUsageError {
  override name = 'KeyConflict';
  /** The id of the key that holds it. */
  readonly existing: string;
  constructor(message: string, existing: string) {
    super(message);
    this.existing = existing;
  }
}

const NAME = /^[A-Za-z0-9][A-Za-z0-9._@:-]{0,63}$/;
/** Longer-lived keys are a leak waiting to happen; ten years is already generous. */
const MAX_LIFETIME_MS = 3_652 * 86_400_000;

export interface CreatedKey {
  readonly record: KeyRecord;
  /** Shown once, never stored. */
  readonly token: string;
}

export interface KeyOptions {
  /** Lifetime from now, ms; null for none. */
  readonly expiresInMs?: number | null;
  /** Routes the key may use; null for every route. */
  readonly routes?: readonly string[] | null;
  readonly limits?: Limits;
  /** The caller's own id for the key (keys as code): unique in the store. */
  readonly externalId?: string | null;
}

function checkLifetime(ms: number | null | undefined): void {
  if (ms !== null && ms !== undefined && (ms <= 0 || ms > MAX_LIFETIME_MS)) {
    throw new KeyUsageError('--expires-in must be a positive duration of at most ten years (3652d)');
  }
}

/** By id, or the active one of that name, or else the latest revoked one of that name (keys and admin tokens alike); null when none. */
export function byIdOrName<T extends { readonly id: string; readonly name: string; readonly revoked: string | null }>(
  list: readonly T[],
  idOrName: string,
): T | null {
  return (
    list.find((r) => r.id === idOrName) ?? list.find((r) => r.name === idOrName && r.revoked === null) ?? list.findLast((r) => r.name === idOrName) ?? null
  );
}

/** A key by id, by `ext:<external id>`, or by name as byIdOrName; null when none. */
export function findKey(records: readonly KeyRecord[], idOrName: string): KeyRecord | null {
  if (idOrName.startsWith('ext:')) {
    // The active key first: a key revoked by an older version may still hold the id (revocation frees it now).
    const id = idOrName.slice(4);
    return records.find((r) => r.externalId === id && r.revoked === null) ?? records.find((r) => r.externalId === id) ?? null;
  }
  return byIdOrName(records, idOrName);
}

/** The names keys and admin tokens take; a KeyUsageError saying the rule otherwise. */
export function checkName(name: string): void {
  if (!NAME.test(name)) throw new KeyUsageError('--name must be 1-64 characters of letters, digits and . _ @ : - (starting with a letter or digit)');
}

/** A key as findKey finds it, or a KeyUsageError naming what was asked for. */
function find(records: readonly KeyRecord[], idOrName: string): KeyRecord {
  const found = findKey(records, idOrName);
  if (found === null) throw new KeyUsageError(`no key with id or name ${idOrName}`);
  return found;
}

function checkExternalId(id: string | null | undefined): void {
  if (typeof id === 'string' && !EXTERNAL_ID.test(id)) throw new KeyUsageError('--external-id must be 1-128 printable characters without spaces');
}

/** Another key already holding external id `id`: a conflict naming it. */
function claimExternalId(records: readonly KeyRecord[], id: string | null | undefined, self: string | null): void {
  if (typeof id !== 'string') return;
  // A revoked key holds nothing: its external id is free to be given to the key that replaces it.
  const holder = records.find((r) => r.externalId === id && r.id !== self && r.revoked === null);
  if (holder !== undefined) throw new KeyConflict(`externalId ${id} is already key ${holder.id}`, holder.id);
}

function replace(records: readonly KeyRecord[], old: KeyRecord, next: KeyRecord): KeyRecord[] {
  return records.map((r) => (r === old ? next : r));
}

export async function createKey(store: KeyStore, name: string, options: KeyOptions = {}, now = Date.now(), update: UpdateOptions = {}): Promise<CreatedKey> {
  checkName(name);
  checkLifetime(options.expiresInMs);
  checkExternalId(options.externalId);
  const token = generateToken();
  const record: KeyRecord = {
    id: `key_${randomBytes(6).toString('hex')}`,
    name,
    digest: `sha256:${tokenDigest(token)}`,
    created: new Date(now).toISOString(),
    expires: options.expiresInMs === null || options.expiresInMs === undefined ? null : new Date(now + options.expiresInMs).toISOString(),
    revoked: null,
    ...(options.routes === null || options.routes === undefined ? {} : { routes: [...options.routes] }),
    ...(options.limits === undefined ? {} : { limits: options.limits }),
    ...(typeof options.externalId === 'string' ? { externalId: options.externalId } : {}),
  };
  await store.update((records) => {
    claimExternalId(records, options.externalId, null);
    const same = records.find((r) => r.name === name && r.revoked === null);
    if (same !== undefined) throw new KeyConflict(`a key named ${name} already exists; revoke it first or pick another name`, same.id);
    return { records: [...records, record], result: undefined };
  }, update);
  return { record, token };
}

export async function listKeys(store: KeyStore): Promise<readonly KeyRecord[]> {
  return store.load();
}

/** Revoke by id or name. Revoking a revoked key changes nothing and is not an error (by id or by name). */
export async function revokeKey(
  store: KeyStore,
  idOrName: string,
  now = Date.now(),
  update: UpdateOptions = {},
): Promise<{ record: KeyRecord; already: boolean }> {
  return store.update<{ record: KeyRecord; already: boolean }>((records) => {
    const target = find(records, idOrName);
    if (target.revoked !== null) return { records, result: { record: target, already: true } };
    const revoked: KeyRecord = { ...target, revoked: new Date(now).toISOString(), previous: [] };
    // The external id is freed (its audit entry says so): the caller's own id goes to the key that replaces this one.
    delete (revoked as { externalId?: unknown }).externalId;
    return { records: replace(records, target, revoked), result: { record: revoked, already: false } };
  }, update);
}

/**
 * A new token for the same key (id, name and scope kept). The old
 * token keeps working for `graceMs` only; tokens rotated out earlier whose
 * grace has passed are dropped.
 */
export async function rotateKey(
  store: KeyStore,
  idOrName: string,
  graceMs: number,
  now = Date.now(),
  update: UpdateOptions = {},
): Promise<CreatedKey & { readonly graceUntil: string | null }> {
  if (graceMs < 0 || graceMs > 366 * 86_400_000) throw new KeyUsageError('--grace must be a duration from 0s to 366d');
  const token = generateToken();
  // The grace of this rotation only: earlier rotations' tokens keep their own dates.
  const graceUntil = graceMs > 0 ? new Date(now + graceMs).toISOString() : null;
  const record = await store.update((records) => {
    const target = find(records, idOrName);
    if (target.revoked !== null) throw new KeyUsageError(`key ${target.id} (${target.name}) is revoked; create a new key instead`);
    const still = (target.previous ?? []).filter((p) => Date.parse(p.until) > now);
    const previous = graceMs > 0 ? [...still, { digest: target.digest, until: graceUntil as string }] : still;
    const next: KeyRecord = { ...target, digest: `sha256:${tokenDigest(token)}`, previous };
    return { records: replace(records, target, next), result: next };
  }, update);
  return { record, token, graceUntil };
}

/**
 * Add the keys of another store (digests only). Keys already there, by id or
 * by token, are left as they are, so importing twice is harmless. Returns how many were added.
 */
export async function importKeys(store: KeyStore, incoming: readonly KeyRecord[], update: UpdateOptions = {}): Promise<number> {
  return store.update(
    (records) => {
      const have = new Set(records.flatMap((r) => [r.id, r.digest]));
      const fresh = incoming.filter((r) => !have.has(r.id) && !have.has(r.digest));
      return { records: [...records, ...fresh], result: fresh.length };
    },
    // Each key it adds is audited as imported, not created.
    { ...update, importing: true },
  );
}

export interface KeyChanges {
  readonly routes?: readonly string[] | null;
  readonly expiresInMs?: number | null;
  /** The key's limits from here on (undefined in `limits`: none). */
  readonly limits?: (current: Limits | undefined) => Limits | undefined;
  /** A new external id; null removes it. */
  readonly externalId?: string | null;
}

/** Change a key's scope, expiry or limits without changing its token. */
export async function updateKey(store: KeyStore, idOrName: string, changes: KeyChanges, now = Date.now(), update: UpdateOptions = {}): Promise<KeyRecord> {
  checkLifetime(changes.expiresInMs);
  checkExternalId(changes.externalId);
  return store.update((records) => {
    const target = find(records, idOrName);
    if (target.revoked !== null) throw new KeyConflict(`key ${target.id} (${target.name}) is revoked`, target.id);
    claimExternalId(records, changes.externalId, target.id);
    let next: KeyRecord = { ...target };
    if (changes.externalId !== undefined) {
      next = { ...next, externalId: changes.externalId as string };
      if (changes.externalId === null) delete (next as { externalId?: unknown }).externalId;
    }
    if (changes.routes !== undefined) {
      next = { ...next, routes: changes.routes === null ? null : [...changes.routes] };
    }
    if (changes.expiresInMs !== undefined) next = { ...next, expires: changes.expiresInMs === null ? null : new Date(now + changes.expiresInMs).toISOString() };
    if (changes.limits !== undefined) {
      const limits = changes.limits(target.limits);
      next = { ...next, limits };
      if (limits === undefined) delete (next as { limits?: unknown }).limits;
    }
    return { records: replace(records, target, next), result: next };
  }, update);
}
