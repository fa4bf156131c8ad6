// The usage ledger in a SQLite file beside the keys file (docs/limits.md),
// through Node's built-in node:sqlite: no dependency, WAL so that `keyward
// usage` can read while a gateway writes. The keys file is never rewritten
// for usage.
import { chmodSync, closeSync, existsSync, openSync } from 'node:fs';
import { DatabaseSync } from 'node:sqlite';
import { Worker } from 'node:worker_threads';
import { rowColumns } from './columns.ts';
import type { LeaseStore } from '../limits/leases.ts';
import { LEASE_SCHEMA, SqliteLeaseStore } from './sqlite-leases.ts';
import type { RunStore } from './runs.ts';
import { addRunCredential, RUN_INSERT, RUN_SCHEMA, SqliteRunStore } from './sqlite-runs.ts';
import type { AlertRow, AlertStore, BatchId, CredentialRow, DayTotal, KeyTotal, ReportQueries, UsageRow, UsageStore } from './store.ts';
import { asError } from '../lib/error.ts';
import { LedgerMark } from './sqlite-mark.ts';

const SCHEMA = `
  create table if not exists usage (
    key_id text not null, route text not null, day text not null,
    requests integer not null default 0, s2xx integer not null default 0, s3xx integer not null default 0,
    s4xx integer not null default 0, s5xx integer not null default 0, other integer not null default 0,
    limited integer not null default 0, bytes_in integer not null default 0, bytes_out integer not null default 0,
    cost real not null default 0,
    primary key (key_id, route, day)
  );
  create table if not exists batches (gateway text primary key, seq integer not null, at text not null);
  create table if not exists credential_usage (
    route text not null, credential integer not null, day text not null,
    requests integer not null default 0, s2xx integer not null default 0, s3xx integer not null default 0,
    s4xx integer not null default 0, s5xx integer not null default 0, other integer not null default 0,
    cost real not null default 0,
    primary key (route, credential, day)
  );
  create index if not exists usage_day on usage (day);
  create table if not exists alerts (
    id text primary key, key_id text not null, body text not null, at integer not null,
    delivered integer not null default 0, sender text, sending_until integer not null default 0
  )`;

// Applied once: a batch at or below the number recorded for its gateway is already counted (ledger.ts).
const BATCH = `
  insert into batches (gateway, seq, at) values (?, ?, ?)
  on conflict (gateway) do update set seq = excluded.seq, at = excluded.at where batches.seq < excluded.seq
  returning seq`;

const CREDENTIAL_UPSERT = `
  insert into credential_usage (route, credential, day, requests, s2xx, s3xx, s4xx, s5xx, other, cost)
  values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
  on conflict (route, credential, day) do update set
    requests = requests + excluded.requests, s2xx = s2xx + excluded.s2xx, s3xx = s3xx + excluded.s3xx,
    s4xx = s4xx + excluded.s4xx, s5xx = s5xx + excluded.s5xx, other = other + excluded.other, cost = cost + excluded.cost`;

const UPSERT = `
  insert into usage (key_id, route, day, requests, s2xx, s3xx, s4xx, s5xx, other, limited, bytes_in, bytes_out, cost)
  values (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
  on conflict (key_id, route, day) do update set
    requests = requests + excluded.requests, s2xx = s2xx + excluded.s2xx, s3xx = s3xx + excluded.s3xx,
    s4xx = s4xx + excluded.s4xx, s5xx = s5xx + excluded.s5xx, other = other + excluded.other,
    limited = limited + excluded.limited, bytes_in = bytes_in + excluded.bytes_in,
    bytes_out = bytes_out + excluded.bytes_out, cost = cost + excluded.cost`;

export class SqliteUsageStore implements UsageStore, AlertStore, ReportQueries {
  readonly location: string;
  readonly #db: DatabaseSync;
  /** Its id and write count, remembered beside the file (sqlite-mark.ts). */
  readonly #mark: LedgerMark;
  /** Quotas and budgets move in the file before a unit is admitted (sqlite-leases.ts). */
  readonly leases: LeaseStore;
  /** Scraper runs waiting for their cost (sqlite-runs.ts). */
  readonly runs: RunStore;
  #reader: Worker | null = null;
  #asked = 0;
  readonly #waiting = new Map<number, { resolve: (rows: unknown[]) => void; reject: (err: Error) => void }>();

  get alerts(): AlertStore {
    return this;
  }

  constructor(path: string) {
    this.location = path;
    // Mode 0600 like the keys file, whatever the umask: SQLite creates the
    // file with the process's, and its -wal and -shm take the file's mode.
    // An empty file is a valid empty database.
    if (!existsSync(path)) closeSync(openSync(path, 'a', 0o600));
    for (const f of [path, `${path}-wal`, `${path}-shm`]) if (existsSync(f)) chmodSync(f, 0o600);
    this.#db = new DatabaseSync(path);
    // No busy wait: node:sqlite is synchronous, so waiting for another
    // process's write lock would stall the event loop and every request with
    // it. A flush that finds the file locked fails at once and its batch is
    // sent again at the next flush (ledger.ts); readers never wait in WAL.
    // synchronous = normal: in WAL mode a commit is then not flushed to
    // the disk on the event loop (only checkpoints are); a process that
    // crashes or is killed loses nothing the file had taken, and a power
    // loss may lose the last commits but never corrupts the file
    // (https://www.sqlite.org/pragma.html#pragma_synchronous).
    this.#db.exec('pragma journal_mode = wal; pragma busy_timeout = 0; pragma synchronous = normal;');
    this.#db.exec(SCHEMA);
    this.#db.exec(LEASE_SCHEMA);
    this.#db.exec(RUN_SCHEMA);
    addRunCredential(this.#db);
    this.#mark = new LedgerMark(this.#db, path);
    this.leases = new SqliteLeaseStore(this.#db, Date.now, this.#mark);
    this.runs = new SqliteRunStore(this.#db, this.#mark);
  }

  add(rows: readonly UsageRow[], batch: BatchId): Promise<void> {
    const upsert = this.#db.prepare(UPSERT);
    // One transaction per batch: all of it or none of it.
    this.#db.exec('begin immediate');
    try {
      if (this.#db.prepare(BATCH).get(batch.gateway, batch.seq, new Date().toISOString()) !== undefined) {
        for (const r of rows)
          upsert.run(r.keyId, r.route, r.day, r.requests, r.s2xx, r.s3xx, r.s4xx, r.s5xx, r.other, r.limited, r.bytesIn, r.bytesOut, r.cost);
        if (batch.credentials !== undefined && batch.credentials.length > 0) {
          const c = this.#db.prepare(CREDENTIAL_UPSERT);
          for (const r of batch.credentials) c.run(r.route, r.credential, r.day, r.requests, r.s2xx, r.s3xx, r.s4xx, r.s5xx, r.other, r.cost);
        }
        // Pending runs in the same transaction as the rows that booked their start: both or neither.
        if (batch.runs !== undefined && batch.runs.length > 0) {
          const run = this.#db.prepare(RUN_INSERT);
          for (const r of batch.runs) run.run(r.id, r.keyId, r.route, r.day, r.booked, r.path, r.at, r.credential ?? 1);
        }
      }
      const writes = this.#mark.count();
      this.#db.exec('commit');
      this.#mark.committed(writes);
    } catch (err) {
      // SQLite may have rolled the transaction back itself (a full disk does:
      // SQLITE_FULL); the rollback's own error would then hide the cause.
      if (this.#db.isTransaction) this.#db.exec('rollback');
      return Promise.reject(asError(err));
    }
    return Promise.resolve();
  }

  credentialRows(filter: { since?: string; route?: string }): Promise<CredentialRow[]> {
    const found = this.#db
      .prepare(
        `select route, credential, day, requests, s2xx, s3xx, s4xx, s5xx, other, cost from credential_usage
         where day >= ? and (? is null or route = ?) order by day, route, credential`,
      )
      .all(filter.since ?? '', filter.route ?? null, filter.route ?? null);
    return Promise.resolve(found as unknown as CredentialRow[]);
  }

  rows(filter: { since?: string; keyId?: string; route?: string }): Promise<UsageRow[]> {
    const found = this.#db
      .prepare(`select ${rowColumns()} from usage where day >= ? and (? is null or key_id = ?) and (? is null or route = ?) order by day, key_id, route`)
      .all(filter.since ?? '', filter.keyId ?? null, filter.keyId ?? null, filter.route ?? null, filter.route ?? null);
    return Promise.resolve(found as unknown as UsageRow[]);
  }

  /** A query as a promise: node:sqlite is synchronous, and a locked file fails at once (no busy wait). */
  #run<T>(work: () => T): Promise<T> {
    try {
      return Promise.resolve(work());
    } catch (err) {
      return Promise.reject(asError(err));
    }
  }

  get report(): ReportQueries {
    return this;
  }

  daily(since: string, keyId: string | null, route: string | null): Promise<DayTotal[]> {
    return this.#read<DayTotal>(
      'select day, route, sum(requests) as requests, sum(cost) as cost from usage where day >= ? and (? is null or key_id = ?) and (? is null or route = ?) group by day, route order by day, route',
      [since, keyId, keyId, route, route],
    );
  }

  byKey(since: string, keyIds: readonly string[] | null): Promise<KeyTotal[]> {
    return keyIds === null
      ? this.#read<KeyTotal>('select key_id as keyId, route, sum(requests) as requests, sum(cost) as cost from usage where day >= ? group by key_id, route', [
          since,
        ])
      : this.#read<KeyTotal>(
          'select key_id as keyId, route, sum(requests) as requests, sum(cost) as cost from usage where key_id in (select value from json_each(?)) and day >= ? group by key_id, route',
          [JSON.stringify(keyIds), since],
        );
  }

  /** A read for the usage page, in the reader thread (sqlite-reader.ts), started on first use. */
  #read<T>(sql: string, params: Array<string | number | null>): Promise<T[]> {
    if (this.#reader === null) {
      const here = import.meta.url;
      // Run from source (tests, tsx) or built (dist): the reader is beside this module either way.
      this.#reader = new Worker(new URL(here.endsWith('.ts') ? './sqlite-reader.ts' : './sqlite-reader.js', here), { workerData: this.location });
      this.#reader.unref();
      const waiting = this.#waiting;
      this.#reader.on('message', (m: { id: number; rows?: T[]; error?: string }) => {
        const w = waiting.get(m.id);
        waiting.delete(m.id);
        if (m.error !== undefined) w?.reject(new Error(m.error));
        else w?.resolve(m.rows ?? []);
      });
      this.#reader.on('error', (err: Error) => {
        for (const w of waiting.values()) w.reject(err);
        waiting.clear();
        this.#reader = null;
      });
    }
    const id = ++this.#asked;
    return new Promise<T[]>((resolve, reject) => {
      this.#waiting.set(id, { resolve: resolve as (rows: unknown[]) => void, reject });
      this.#reader?.postMessage({ id, sql, params });
    });
  }

  claimAlert(a: AlertRow): Promise<boolean> {
    return this.#run(
      () =>
        this.#db
          .prepare('insert into alerts (id, key_id, body, at) values (?, ?, ?, ?) on conflict do nothing returning id')
          .get(a.id, a.keyId, a.body, a.at) !== undefined,
    );
  }

  alertDelivered(id: string): Promise<void> {
    return this.#run(() => void this.#db.prepare('update alerts set delivered = 1 where id = ?').run(id));
  }

  undeliveredAlerts(by: string, since: number, forMs: number): Promise<AlertRow[]> {
    const now = Date.now();
    return this.#run(
      () =>
        this.#db
          .prepare(
            'update alerts set sender = ?, sending_until = ? where delivered = 0 and at >= ? and sending_until < ? returning id, key_id as keyId, body, at',
          )
          .all(by, now + forMs, since, now) as unknown as AlertRow[],
    );
  }

  close(): Promise<void> {
    if (this.#db.isOpen) {
      try {
        // Everything committed reaches the main file before the process goes.
        this.#mark.checkpoint();
      } catch {
        // A full disk: the -wal file keeps it, as before.
      } finally {
        this.#db.close();
      }
    }
    const reader = this.#reader;
    this.#reader = null;
    return reader === null ? Promise.resolve() : reader.terminate().then(() => undefined);
  }
}

/** The ledger's file for a keys file: `keys.json` → `keys.json.usage.sqlite`. */
export const usagePath = (keysFile: string): string => `${keysFile}.usage.sqlite`;
