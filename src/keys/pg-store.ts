// Keys in PostgreSQL, for fleets of gateways (docs/fleet.md): the same
// KeyStore seam as the keys file, so the request path does not change. The
// only importer of postgres.js (pg-schema.ts and pg-watch.ts take its types
// and the connection from here). Writes take keyward's advisory lock and
// announce the keys they changed; the tables' triggers (pg-schema.ts) make
// writes by anyone else reach the gateways the same way; pg-watch.ts follows
// them.
import postgres from 'postgres';
import type { KeyRecord } from './keyset.ts';
import { allRows, CHANNEL, MIGRATION_LOCK, MIGRATIONS, notice, toRecord, WRITE_LOCK } from './pg-schema.ts';
import { PgUsageStore } from './pg-usage.ts';
import { reconnectDelayMs, watchTable } from './pg-watch.ts';
import { validRecords } from './record.ts';
import type { Change, KeyStore, UpdateOptions } from './store.ts';

export { MIGRATIONS, notice, noticeVersion } from './pg-schema.ts';

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

export class PgKeyStore implements KeyStore {
  readonly location: string;
  readonly shared = true;
  get title(): string {
    return `keys in ${this.location}`;
  }
  readonly #sql: postgres.Sql;
  #migrated: Promise<Migration> | null = null;

  constructor(url: string) {
    this.location = describeDatabase(url);
    this.#sql = postgres(url, { max: 4, onnotice: () => undefined, connect_timeout: 5, idle_timeout: 60, backoff: (retries: number) => reconnectDelayMs(retries) / 1000 });
  }

  /** Apply pending migrations under an advisory lock (several gateways may start at once); says which versions it went between. */
  migrate(): Promise<Migration> {
    this.#migrated ??= this.#sql
      .begin(async (tx) => {
        await tx`select pg_advisory_xact_lock(${MIGRATION_LOCK})`;
        await tx`create table if not exists keyward_schema (version int primary key, applied timestamptz not null default now())`;
        const [row] = await tx<Array<{ v: number | null }>>`select max(version) as v from keyward_schema`;
        const from = row?.v ?? 0;
        for (let v = from + 1; v <= MIGRATIONS.length; v++) {
          await tx.unsafe(MIGRATIONS[v - 1] as string);
          await tx`insert into keyward_schema (version) values (${v})`;
        }
        return { from, to: Math.max(from, MIGRATIONS.length) };
      })
      .catch((err: Error) => {
        this.#migrated = null;
        throw err;
      });
    return this.#migrated;
  }

  /** The valid keys: a row that fails the record check is left out here too (the watch reports it). */
  async load(): Promise<readonly KeyRecord[]> {
    await this.migrate();
    return validRecords((await allRows(this.#sql)).map(toRecord)).valid;
  }

  watch(
    onChange: (records: readonly KeyRecord[]) => void,
    onError: (err: Error) => void,
    onStatus?: PgStatus,
    onInvalid?: (invalid: ReadonlyMap<string, string>) => void,
  ): () => void {
    return watchTable({ sql: this.#sql, migrate: () => this.migrate(), snapshot: (read) => this.#snapshot(read) }, { onChange, onError, onStatus, onInvalid });
  }

  /** Run `read` in one read-only snapshot, so rows, tombstones and checksum agree. */
  #snapshot<T>(read: (tx: postgres.TransactionSql) => Promise<T>): Promise<T> {
    return this.#sql.begin('isolation level repeatable read read only', read) as Promise<T>;
  }

  async update<T>(change: (records: readonly KeyRecord[]) => Change<T>, _options: UpdateOptions = {}): Promise<T> {
    await this.migrate();
    return this.#sql.begin(async (tx) => {
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
          insert into keyward_keys (id, name, digest, created, expires, revoked, routes, previous, limits, version)
          values (${r.id}, ${r.name}, ${r.digest}, ${r.created}, ${r.expires}, ${r.revoked}, ${r.routes ?? null}, ${tx.json((r.previous ?? []) as never)}, ${r.limits === undefined ? null : tx.json(r.limits as never)}, nextval('keyward_keys_version'))
          on conflict (id) do update set name = excluded.name, digest = excluded.digest, expires = excluded.expires,
            revoked = excluded.revoked, routes = excluded.routes, previous = excluded.previous, limits = excluded.limits, version = excluded.version
          returning version::text`;
        top = row?.version ?? top;
      }
      if (changed.length > 0) await tx`select pg_notify(${CHANNEL}, ${notice(top, changed.map((r) => r.id))})`;
      return next.result;
    }) as Promise<T>;
  }

  async recordUse(uses: ReadonlyMap<string, number>): Promise<void> {
    if (uses.size === 0) return;
    const ids = [...uses.keys()];
    const times = ids.map((id) => new Date(uses.get(id) as number).toISOString());
    // Not a key change: no new version, no notification, no reload anywhere.
    await this.#sql`
      update keyward_keys k set last_used = greatest(k.last_used, u.t)
      from (select unnest(${ids}::text[]) as id, unnest(${times}::timestamptz[]) as t) u where k.id = u.id`;
  }

  async lastUse(): Promise<ReadonlyMap<string, string>> {
    await this.migrate();
    const rows = await this.#sql<Array<{ id: string; last_used: Date }>>`select id, last_used from keyward_keys where last_used is not null`;
    return new Map(rows.map((r) => [r.id, r.last_used.toISOString()]));
  }

  usage(): PgUsageStore {
    return new PgUsageStore(this.#sql, this.location, () => this.migrate());
  }

  async close(): Promise<void> {
    await this.#sql.end({ timeout: 2 });
  }
}
