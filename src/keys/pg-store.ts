// Keys in PostgreSQL, for fleets of gateways (design §9): the same KeyStore
// seam as the keys file, so the request path does not change. The only
// importer of postgres.js.
//
// Change feed: every write gives the rows it touches a new `version` from
// one sequence and sends NOTIFY on `keyward_keys`. A gateway fetches only the
// rows with a version above the highest it holds, so a change costs one
// small query whatever the number of keys. After every (re)connect the
// subscription comes first and a full reload second (postgres.js calls
// `onlisten` on each subscribe), so a change made while a gateway was cut off
// is never missed; a once-a-second `max(version)` check backs both up and
// tells whether the database is reachable.
import postgres from 'postgres';
import type { KeyRecord } from './keyset.ts';
import type { Change, KeyStore, UpdateOptions } from './store.ts';

const CHANNEL = 'keyward_keys';
const CHECK_MS = 1_000;
// Arbitrary constants naming keyward's advisory locks.
const MIGRATION_LOCK = 0x6b657977; // "keyw"
const WRITE_LOCK = 0x6b657978;

/** Versioned migrations, applied in order; never edit one that has shipped. */
export const MIGRATIONS: readonly string[] = [
  `create table keyward_keys (
     id text primary key,
     name text not null,
     digest text not null,
     created timestamptz not null,
     expires timestamptz,
     revoked timestamptz,
     routes text[],
     previous jsonb not null default '[]',
     last_used timestamptz,
     version bigint not null
   );
   create sequence keyward_keys_version;
   create unique index keyward_keys_digest on keyward_keys (digest);
   create index keyward_keys_version_idx on keyward_keys (version);`,
];

interface Row {
  id: string;
  name: string;
  digest: string;
  created: Date;
  expires: Date | null;
  revoked: Date | null;
  routes: string[] | null;
  previous: Array<{ digest: string; until: string }>;
  version: string;
}

/** Every key, in creation order: the whole set a load, a resync and a write start from. */
const allRows = (sql: postgres.Sql | postgres.TransactionSql): Promise<Row[]> =>
  sql<Row[]>`select id, name, digest, created, expires, revoked, routes, previous, version from keyward_keys order by created, id`;

const iso = (d: Date | null): string | null => (d === null ? null : d.toISOString());

function toRecord(r: Row): KeyRecord {
  const rec: KeyRecord = { id: r.id, name: r.name, digest: r.digest, created: r.created.toISOString(), expires: iso(r.expires), revoked: iso(r.revoked) };
  return { ...rec, ...(r.routes === null ? {} : { routes: r.routes }), ...(r.previous.length === 0 ? {} : { previous: r.previous }) };
}

/** Where the keys are, for messages: host, port and database, never the password. */
export function describeDatabase(url: string): string {
  try {
    const u = new URL(url);
    return `postgres ${u.hostname}:${u.port || '5432'}${u.pathname || '/'}`;
  } catch {
    return 'postgres (unparsable URL)';
  }
}

// NOTIFY payloads are limited to 8000 bytes by default.
const NOTICE_MAX = 7_900;

/**
 * The notification names what changed: the highest version written and the
 * ids, or only their number when the ids would not fit. Gateways need only
 * the version (they fetch the rows above the one they hold); the ids are for
 * people and tools listening on the channel.
 */
export function notice(version: string, ids: readonly string[]): string {
  const full = JSON.stringify({ version, ids });
  return full.length <= NOTICE_MAX ? full : JSON.stringify({ version, count: ids.length });
}

/** The version a notification announces, or null when it names none (then fetch). */
export function noticeVersion(payload: string): bigint | null {
  try {
    const v = (JSON.parse(payload) as { version?: unknown }).version;
    return typeof v === 'string' && /^\d+$/.test(v) ? BigInt(v) : null;
  } catch {
    return null;
  }
}

/** Schema versions before and after `migrate()`; equal when there was nothing to do. */
export interface Migration {
  readonly from: number;
  readonly to: number;
}

/**
 * How long to wait before reconnect attempt `retries` (0 for the first):
 * doubling from 50 ms, capped at one second, each delay drawn uniformly from
 * its upper half. A gateway therefore notices a database that is back within
 * a second, and never tries more than twice a second: N gateways make at
 * most 2N connection attempts per second against a recovering server, spread
 * over the second rather than in step. (postgres.js's default grows to 20 s,
 * which left gateways blind for seconds after an outage.)
 */
export function reconnectDelayMs(retries: number): number {
  const cap = Math.min(RECONNECT_MAX_MS, 50 * 2 ** Math.max(0, retries));
  return cap * (0.5 + Math.random() / 2);
}
const RECONNECT_MAX_MS = 1_000;

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

  async load(): Promise<readonly KeyRecord[]> {
    await this.migrate();
    return (await allRows(this.#sql)).map(toRecord);
  }

  watch(onChange: (records: readonly KeyRecord[]) => void, onError: (err: Error) => void, onStatus?: PgStatus): () => void {
    let stopped = false;
    let records: KeyRecord[] = [];
    const index = new Map<string, number>();
    let version = -1n;
    let up = true;
    let busy: Promise<void> = Promise.resolve();
    const status = (now: boolean, err?: Error): void => {
      if (now !== up) {
        up = now;
        onStatus?.(now, err);
      }
    };
    const full = async (): Promise<void> => {
      await this.migrate();
      const rows = await allRows(this.#sql);
      records = rows.map(toRecord);
      index.clear();
      records.forEach((r, i) => index.set(r.id, i));
      version = rows.reduce((m, r) => (BigInt(r.version) > m ? BigInt(r.version) : m), 0n);
      if (!stopped) onChange(records);
    };
    const since = async (): Promise<void> => {
      const rows = await this.#sql<Row[]>`select id, name, digest, created, expires, revoked, routes, previous, version from keyward_keys where version > ${version.toString()} order by version`;
      if (rows.length === 0) return;
      const next = records.slice();
      for (const row of rows) {
        const rec = toRecord(row);
        const at = index.get(rec.id);
        if (at === undefined) {
          index.set(rec.id, next.length);
          next.push(rec);
        } else next[at] = rec;
        if (BigInt(row.version) > version) version = BigInt(row.version);
      }
      records = next;
      if (!stopped) onChange(records);
    };
    // One at a time, in order: a full reload and an increment never interleave.
    const serial = (work: () => Promise<void>): void => {
      busy = busy.then(work).then(
        () => status(true),
        (err: Error) => {
          status(false, err);
          if (!stopped) onError(err);
        },
      );
    };

    let attempt = 0;
    let listening: { unlisten(): Promise<void> } | null = null;
    let retry: NodeJS.Timeout | null = null;
    const subscribe = (): void => {
      this.#sql
        .listen(
          CHANNEL,
          (payload) => serial(async () => {
            // Already held (the periodic check or an earlier notice got there first): nothing to fetch.
            const announced = noticeVersion(payload);
            if (announced === null || announced > version) await since();
          }),
          () => serial(full),
        ) // onlisten: every (re)subscribe, then a full reload
        .then((l) => {
          attempt = 0;
          listening = l;
          if (stopped) void l.unlisten();
        })
        .catch((err: Error) => {
          status(false, err);
          if (stopped) return;
          const delay = reconnectDelayMs(attempt++);
          retry = setTimeout(subscribe, delay);
          retry.unref();
        });
    };
    subscribe();
    // The periodic check: reachability, and any change a notification missed.
    const check = setInterval(() => {
      if (listening === null) return;
      serial(async () => {
        const [row] = await this.#sql<Array<{ v: string | null }>>`select max(version)::text as v from keyward_keys`;
        if (row?.v !== null && row?.v !== undefined && BigInt(row.v) > version) await since();
      });
    }, CHECK_MS);
    check.unref();
    return () => {
      stopped = true;
      clearInterval(check);
      if (retry !== null) clearTimeout(retry);
      if (listening !== null) void (listening as { unlisten(): Promise<void> }).unlisten().catch(() => undefined);
    };
  }

  async update<T>(change: (records: readonly KeyRecord[]) => Change<T>, _options: UpdateOptions = {}): Promise<T> {
    await this.migrate();
    return this.#sql.begin(async (tx) => {
      // One writer at a time across the fleet and every CLI: the change sees the set it replaces.
      await tx`select pg_advisory_xact_lock(${WRITE_LOCK})`;
      const rows = await allRows(tx);
      const before = rows.map(toRecord);
      const byId = new Map(before.map((r) => [r.id, JSON.stringify(r)]));
      const next = change(before);
      const changed = next.records.filter((r) => byId.get(r.id) !== JSON.stringify(r));
      let top = '0';
      for (const r of changed) {
        const [row] = await tx<Array<{ version: string }>>`
          insert into keyward_keys (id, name, digest, created, expires, revoked, routes, previous, version)
          values (${r.id}, ${r.name}, ${r.digest}, ${r.created}, ${r.expires}, ${r.revoked}, ${r.routes ?? null}, ${tx.json((r.previous ?? []) as never)}, nextval('keyward_keys_version'))
          on conflict (id) do update set name = excluded.name, digest = excluded.digest, expires = excluded.expires,
            revoked = excluded.revoked, routes = excluded.routes, previous = excluded.previous, version = excluded.version
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

  async close(): Promise<void> {
    await this.#sql.end({ timeout: 2 });
  }
}
