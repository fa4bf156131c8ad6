// The key store seam (docs/keys.md): load the full set, watch for changes, apply
// a change. The file store is one implementation; a shared store for a fleet
// implements the same calls and the request path does not change.
import type { KeyRecord } from './keyset.ts';
import type postgres from 'postgres';
import type { Actor, AuditEntry, AuditHead } from './audit.ts';
import type { AdminRecord } from './admin-record.ts';

export interface Change<T> {
  readonly records: readonly KeyRecord[];
  readonly result: T;
}

export interface UpdateOptions {
  /** Replace a store that cannot be read (a corrupt keys file) instead of refusing to write over it. */
  readonly force?: boolean;
  /** Who makes the change, for its audit entry (audit.ts); absent: the OS user running this process. */
  readonly actor?: Actor;
  readonly requestId?: string | null;
  /** The change imports keys (`key.import` entries rather than `key.create`). */
  readonly importing?: boolean;
}

/** A database pool with a deadline on every query, and the schema's migrations: what the ledger kept beside the keys uses. */
export interface Database {
  bounded<T>(work: (sql: postgres.Sql) => Promise<T>): Promise<T>;
  migrate(): Promise<unknown>;
}

export interface KeyStore {
  /** Where the keys live, for messages (never a secret). */
  readonly location: string;
  /** The store as the CLI names it on stderr: `keys file PATH` or `keys in postgres HOST:PORT/DB`. */
  readonly title?: string;
  /** Where a forced write moved a store that could not be read (the keys file's `--force`); null otherwise. */
  readonly setAside?: string | null;
  load(): Promise<readonly KeyRecord[]>;
  /**
   * Report every change within one second. `onError` gets changes that could
   * not be read; the caller keeps serving its last good set. `onChange` may
   * throw: the change is then not in force, the store reports itself down
   * and tries again. `onInvalid` gets the rows skipped because they fail the
   * record check (id → problem), whenever that list changes; `onWarning`
   * what an operator should fix in the store. Returns `stop`.
   */
  watch(
    onChange: (records: readonly KeyRecord[]) => void,
    onError: (err: Error) => void,
    onStatus?: (up: boolean, err?: Error) => void,
    onInvalid?: (invalid: ReadonlyMap<string, string>) => void,
    onWarning?: (message: string, fields: Record<string, unknown>) => void,
  ): () => void;
  /** A store shared by a fleet (PostgreSQL): a gateway may start before it is reachable. */
  readonly shared?: boolean;
  /** The database these keys are kept in, when they are (PostgreSQL): the usage ledger is kept beside them (ledger/open.ts). */
  readonly database?: Database;
  /** Release connections (the CLI's exit). */
  close?(): Promise<void>;
  /** Apply `change` to the current set under the store's lock and persist the result. */
  update<T>(change: (records: readonly KeyRecord[]) => Change<T>, options?: UpdateOptions): Promise<T>;
  /** Record last-use times (key id → ms since the epoch), keeping later times already stored. */
  recordUse(uses: ReadonlyMap<string, number>): Promise<void>;
  /** Last-use times by key id, ISO 8601. */
  lastUse(): Promise<ReadonlyMap<string, string>>;
  /** The audit log of changes to keys, in order (audit.ts). */
  auditEntries(): Promise<AuditEntry[]>;
  /** Where the store itself recorded the log's end (audit-check.ts), each with where it was read; none where it keeps no such record. */
  auditAnchors?(): Promise<ReadonlyArray<{ readonly head: AuditHead; readonly from: string }>>;
  /** The log's head now, for the gateway's `audit log head` line at each change. */
  auditHead(): Promise<AuditHead | null>;
  /** The admin tokens (admins.ts), read afresh: a revocation holds at once, on every gateway. */
  admins(): Promise<readonly AdminRecord[]>;
  /** Apply `change` to the admin tokens under the keys' lock, with its audit entries. */
  updateAdmins<T>(
    change: (admins: readonly AdminRecord[]) => { readonly admins: readonly AdminRecord[]; readonly result: T },
    options?: UpdateOptions,
  ): Promise<T>;
}
