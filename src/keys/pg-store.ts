// Keys in PostgreSQL, for fleets of gateways (docs/fleet.md): the same
// KeyStore seam as the keys file, so the request path does not change. The
// only importer of postgres.js (pg-schema.ts and pg-watch.ts take its types
// and the connection from here). Writes take keyward's advisory lock and
// announce the keys they changed; the tables' triggers (pg-schema.ts) make
// writes by anyone else reach the gateways the same way; pg-watch.ts follows
// them.
import { within } from '../lib/deadline.ts';
import { adminDrafts, chain, cliActor, drafts, type AuditDraft, type AuditEntry } from './audit.ts';
import { adminProblem, type AdminRecord } from './admin-record.ts';
import { bodyOf, entryOf } from './audit-sqlite.ts';
import type { AuditHead } from './audit.ts';
import postgres from 'postgres';
import type { KeyRecord } from './keyset.ts';
import { allRows, CHANNEL, instant, isoInstant, MIGRATION_LOCK, MIGRATIONS, msOf, notice, toRecord, UNPLACEABLE, WRITE_LOCK } from './pg-schema.ts';
import { reconnectDelayMs, watchTable } from './pg-watch.ts';
import { validRecords } from './record.ts';
import type { Change, Database, KeyStore, UpdateOptions } from './store.ts';

/** Where the keys are, for messages: host, port and database, never the password. */
function describeDatabase(url: string): string {
  try {
    const u = new URL(url);
    return `postgres ${u.hostname}:${u.port || '5432'}${u.pathname || '/'}`;
  } catch {
    return 'postgres (unparsable URL)';
  }
}

/** Schema versions before and after `migrate()`; equal when there was nothing to do. */
export interface Migration {
  readonly from: number;
  readonly to: number;
}

export interface PgStatus {
  (up: boolean, err?: Error): void;
}

/** How long a query may go unanswered by default (KEYWARD_DATABASE_TIMEOUT), ms. */
const DATABASE_TIMEOUT_MS = 5_000;
/** A read of the whole key set may take this many times longer (a million rows). */
const FULL_READ_FACTOR = 12;

/** A query that got no answer within its deadline: the path to the server may be dead without having said so. */
class DatabaseTimeout extends Error {
  readonly code = 'KEYWARD_DATABASE_TIMEOUT';
  constructor(ms: number) {
    super(`no answer from PostgreSQL within ${ms} ms; connections dropped and opened again`);
    this.name = 'DatabaseTimeout';
  }
}

/** `drafts` appended to the fleet's one chain, inside the caller's transaction (which holds the write lock). */
async function appendEntries(tx: postgres.TransactionSql, entries: readonly AuditDraft[]): Promise<void> {
  if (entries.length === 0) return;
  const [last] = await tx<Array<{ seq: string; hash: string }>>`select seq::text, hash from keyward_audit order by keyward_audit.seq desc limit 1`;
  const chained = chain(last === undefined ? null : { seq: Number(last.seq), hash: last.hash }, entries);
  // One statement however many keys an import adds.
  await tx`insert into keyward_audit (seq, body, hash)
    select * from unnest(${chained.map((e) => e.seq)}::bigint[], ${chained.map(bodyOf)}::text[], ${chained.map((e) => e.hash)}::text[])`;
  // Where the log ends, recorded apart from it (migration 13).
  const head = chained.at(-1) as AuditEntry;
  await tx`insert into keyward_audit_head (one, seq, hash) values (true, ${head.seq}, ${head.hash})
    on conflict (one) do update set seq = excluded.seq, hash = excluded.hash`;
}

/** What the deadline race gives when a query passed its deadline. */
const LATE = Symbol('keyward.late');

export class PgKeyStore implements KeyStore {
  readonly location: string;
  readonly shared = true;
  /** The usage ledger is kept in the same database, through this pool (ledger/open.ts). */
  readonly database: Database = this;
  get title(): string {
    return `keys in ${this.location}`;
  }
  readonly #url: string;
  /** Every query's deadline, ms (KEYWARD_DATABASE_TIMEOUT). */
  readonly timeoutMs: number;
  #sql: postgres.Sql;
  #migrated: Promise<Migration> | null = null;

  /** The routes a key's budget may name (routes.ts), for the record check. */
  readonly costRoutes: readonly string[];

  constructor(url: string, costRoutes: readonly string[], timeoutMs = DATABASE_TIMEOUT_MS) {
    this.location = describeDatabase(url);
    this.costRoutes = costRoutes;
    this.#url = url;
    this.timeoutMs = timeoutMs;
    this.#sql = this.#connect();
  }

  #connect(): postgres.Sql {
    const seconds = Math.max(1, Math.ceil(this.timeoutMs / 1000));
    return postgres(this.#url, {
      max: 4,
      onnotice: () => undefined,
      connect_timeout: seconds,
      idle_timeout: 60,
      // TCP keepalive: a peer that vanished is noticed by the kernel too, not only by the deadlines below.
      keep_alive: seconds,
      backoff: (retries: number) => reconnectDelayMs(retries) / 1000,
    });
  }

  /** The connection pool in use (replaced after a query passed its deadline). */
  get sql(): postgres.Sql {
    return this.#sql;
  }

  /**
   * `work` against the pool, rejected with DatabaseTimeout once `ms` pass
   * without an answer. A silent partition never errors: a query sent into it
   * waits for ever, and so would every later one queued behind it. Past the
   * deadline the whole pool (LISTEN connection included) is dropped, which
   * fails what still waits on it, and a fresh one is opened.
   */
  bounded<T>(work: (sql: postgres.Sql) => Promise<T>, ms = this.timeoutMs): Promise<T> {
    const used = this.#sql;
    return within(work(used), ms, LATE).then((r) => {
      if (r !== LATE) return r;
      if (this.#sql === used) this.#reset();
      throw new DatabaseTimeout(ms);
    });
  }

  #reset(): void {
    const old = this.#sql;
    this.#sql = this.#connect();
    this.#migrated = null;
    void old.end({ timeout: 0 }).catch(() => undefined);
  }

  /** Apply pending migrations under an advisory lock (several gateways may start at once); says which versions it went between. */
  migrate(): Promise<Migration> {
    this.#migrated ??= this.bounded(
      (sql) =>
        sql.begin(async (tx) => {
          await tx`select pg_advisory_xact_lock(${MIGRATION_LOCK})`;
          await tx`create table if not exists keyward_schema (version int primary key, applied timestamptz not null default now())`;
          const [row] = await tx<Array<{ v: number | null }>>`select max(version) as v from keyward_schema`;
          const from = row?.v ?? 0;
          for (let v = from + 1; v <= MIGRATIONS.length; v++) {
            await tx.unsafe(MIGRATIONS[v - 1] as string);
            await tx`insert into keyward_schema (version) values (${v})`;
          }
          return { from, to: Math.max(from, MIGRATIONS.length) };
        }) as Promise<Migration>,
      this.timeoutMs * FULL_READ_FACTOR,
    ).catch((err: Error) => {
      this.#migrated = null;
      throw err;
    });
    return this.#migrated;
  }

  /** The valid keys: a row that fails the record check is left out here too (the watch reports it). */
  async load(): Promise<readonly KeyRecord[]> {
    await this.migrate();
    return validRecords((await this.bounded((sql) => allRows(sql), this.timeoutMs * FULL_READ_FACTOR)).map(toRecord), this.costRoutes).valid;
  }

  watch(
    onChange: (records: readonly KeyRecord[]) => void,
    onError: (err: Error) => void,
    onStatus?: PgStatus,
    onInvalid?: (invalid: ReadonlyMap<string, string>) => void,
    onWarning?: (message: string, fields: Record<string, unknown>) => void,
  ): () => void {
    return watchTable(
      {
        sql: () => this.#sql,
        costRoutes: this.costRoutes,
        migrate: () => this.migrate(),
        bounded: (work, full) => this.bounded(work, full ? this.timeoutMs * FULL_READ_FACTOR : this.timeoutMs),
        snapshot: (read, full) =>
          this.bounded(
            (sql) => sql.begin('isolation level repeatable read read only', read) as Promise<Awaited<ReturnType<typeof read>>>,
            full ? this.timeoutMs * FULL_READ_FACTOR : this.timeoutMs,
          ),
      },
      { onChange, onError, onStatus, onInvalid, onWarning },
    );
  }

  async update<T>(change: (records: readonly KeyRecord[]) => Change<T>, options: UpdateOptions = {}): Promise<T> {
    await this.migrate();
    return this.bounded(
      (sql) =>
        sql.begin(async (tx) => {
          // One writer at a time across the fleet and every CLI: the change sees the set it replaces.
          await tx`select pg_advisory_xact_lock(${WRITE_LOCK})`;
          // This write announces itself below, naming its keys; the triggers' own notice would repeat it.
          await tx`select set_config('keyward.writer', 'on', true)`;
          const rows = await allRows(tx);
          const before = rows.map(toRecord);
          const byId = new Map(before.map((r) => [r.id, JSON.stringify(r)]));
          const next = change(before);
          const changed = next.records.filter((r) => byId.get(r.id) !== JSON.stringify(r));
          let top = '0';
          for (const r of changed) {
            const [row] = await tx<Array<{ version: string }>>`
          insert into keyward_keys (id, name, digest, created, expires, revoked, routes, previous, limits, external_id, version)
          values (${r.id}, ${r.name}, ${r.digest}, ${r.created}, ${r.expires}, ${r.revoked}, ${r.routes ?? null}, ${tx.json((r.previous ?? []) as never)}, ${r.limits === undefined ? null : tx.json(r.limits as never)}, ${r.externalId ?? null}, nextval('keyward_keys_version'))
          on conflict (id) do update set name = excluded.name, digest = excluded.digest, expires = excluded.expires,
            revoked = excluded.revoked, routes = excluded.routes, previous = excluded.previous, limits = excluded.limits, external_id = excluded.external_id, version = excluded.version
          returning version::text`;
            top = row?.version ?? top;
          }
          // The audit entries in the same transaction: a change whose entry cannot be written is not made.
          await appendEntries(
            tx,
            drafts(
              before,
              next.records,
              { actor: options.actor ?? cliActor(), requestId: options.requestId ?? null, importing: options.importing === true },
              Date.now(),
            ),
          );
          if (changed.length > 0)
            await tx`select pg_notify(${CHANNEL}, ${notice(
              top,
              changed.map((r) => r.id),
            )})`;
          return next.result;
        }) as Promise<T>,
      this.timeoutMs * FULL_READ_FACTOR,
    );
  }

  async recordUse(uses: ReadonlyMap<string, number>): Promise<void> {
    if (uses.size === 0) return;
    const ids = [...uses.keys()];
    const times = ids.map((id) => new Date(uses.get(id) as number).toISOString());
    // Not a key change: no new version, no notification, no reload anywhere.
    await this.bounded(
      (sql) => sql`
      update keyward_keys k set last_used = greatest(k.last_used, u.t)
      from (select unnest(${ids}::text[]) as id, unnest(${times}::timestamptz[]) as t) u where k.id = u.id`,
    );
  }

  async lastUse(): Promise<ReadonlyMap<string, string>> {
    await this.migrate();
    const rows = await this.bounded(
      (sql) =>
        sql<
          Array<{ id: string; last_used: number }>
        >`select id, ${sql.unsafe(instant('last_used'))} as last_used from keyward_keys where last_used is not null`,
      this.timeoutMs * FULL_READ_FACTOR,
    );
    // A time JavaScript cannot place (written by SQL) is left out rather than failing the whole list.
    return new Map(rows.map((r) => [r.id, isoInstant(msOf(r.last_used))] as const).filter(([, t]) => t !== UNPLACEABLE));
  }

  async auditEntries(): Promise<AuditEntry[]> {
    await this.migrate();
    const rows = await this.bounded(
      (sql) => sql<Array<{ seq: string; body: string; hash: string }>>`select seq::text, body, hash from keyward_audit order by keyward_audit.seq`,
      this.timeoutMs * FULL_READ_FACTOR,
    );
    return rows.map(entryOf);
  }

  /** Where the store recorded the log's end at its last append (migration 13); none before the first. */
  async auditAnchors(): Promise<Array<{ head: AuditHead; from: string }>> {
    await this.migrate();
    const [row] = await this.bounded((sql) => sql<Array<{ seq: string; hash: string }>>`select seq::text, hash from keyward_audit_head`);
    return row === undefined ? [] : [{ head: { seq: Number(row.seq), hash: row.hash }, from: 'the keys store (keyward_audit_head)' }];
  }

  /** The log's last entry as the database holds it now (the gateway logs it at each change it loads). */
  async auditHead(): Promise<AuditHead | null> {
    await this.migrate();
    const [last] = await this.bounded((sql) => sql<Array<{ seq: string; hash: string }>>`select seq::text, hash from keyward_audit order by seq desc limit 1`);
    return last === undefined ? null : { seq: Number(last.seq), hash: last.hash };
  }

  async admins(): Promise<readonly AdminRecord[]> {
    await this.migrate();
    const rows = await this.bounded((sql) => sql<AdminRecord[]>`select id, name, role, digest, created, revoked from keyward_admins order by created, id`);
    // A row written by hand that fails the check opens nothing.
    return rows.filter((r) => adminProblem(r) === null).map((r) => ({ ...r }));
  }

  async updateAdmins<T>(
    change: (admins: readonly AdminRecord[]) => { readonly admins: readonly AdminRecord[]; readonly result: T },
    options: UpdateOptions = {},
  ): Promise<T> {
    await this.migrate();
    return this.bounded(
      (sql) =>
        sql.begin(async (tx) => {
          // The keys' write lock: the audit chain has one writer at a time, whatever it changes.
          await tx`select pg_advisory_xact_lock(${WRITE_LOCK})`;
          const before = (await tx<AdminRecord[]>`select id, name, role, digest, created, revoked from keyward_admins order by created, id`).map((r) => ({
            ...r,
          }));
          const was = new Map(before.map((a) => [a.id, JSON.stringify(a)]));
          const next = change(before);
          for (const a of next.admins.filter((x) => was.get(x.id) !== JSON.stringify(x))) {
            await tx`insert into keyward_admins (id, name, role, digest, created, revoked) values (${a.id}, ${a.name}, ${a.role}, ${a.digest}, ${a.created}, ${a.revoked})
              on conflict (id) do update set name = excluded.name, role = excluded.role, digest = excluded.digest, revoked = excluded.revoked`;
          }
          await appendEntries(tx, adminDrafts(before, next.admins, { actor: options.actor ?? cliActor(), requestId: options.requestId ?? null }, Date.now()));
          return next.result;
        }) as Promise<T>,
    );
  }

  async close(): Promise<void> {
    await this.#sql.end({ timeout: 2 });
  }
}
