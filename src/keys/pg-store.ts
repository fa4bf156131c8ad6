// Keys in PostgreSQL, for fleets of gateways (docs/fleet.md): the same
// KeyStore seam as the keys file, so the request path does not change. The
// only importer of postgres.js.
//
// Change feed: triggers on the keys table (migration 2) give every inserted
// or changed row a new `version` from one sequence, leave a tombstone with a
// version for every deleted row, and NOTIFY on `keyward_keys` — whoever
// writes, keyward's CLI or a DBA with SQL. Writers are serialised by one
// advisory lock taken by the triggers, so versions become visible in the
// order they were drawn and "every version above the one I hold" is a
// complete list of changes. A gateway fetches only those rows and
// tombstones, so a change costs one small query whatever the number of
// keys. After every (re)connect the subscription comes first and a full
// reload second (postgres.js calls `onlisten` on each subscribe), so a
// change made while a gateway was cut off is never missed; a once-a-second
// `max(version)` check backs both up and tells whether the database is
// reachable, and every tenth check compares the row count and a checksum of
// the table with the ones last loaded, which catches a change made with the
// triggers switched off.
//
// Every row is checked as it is read (record.ts): a row keyward would never
// write is skipped and reported by id, and never takes the rest with it. A
// set that could not be put in force leaves the store "down" until one is.
import postgres from 'postgres';
import type { KeyRecord } from './keyset.ts';
import { recordProblem, validRecords } from './record.ts';
import type { Change, KeyStore, UpdateOptions } from './store.ts';

const CHANNEL = 'keyward_keys';
const CHECK_MS = 1_000;
/** Every this many checks, the count and checksum are compared too (a full scan of the table). */
const CONSISTENCY_EVERY = 10;
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
  // 2: changes made with SQL reach the gateways like the CLI's own.
  `create table keyward_keys_deleted (
     id text not null,
     version bigint not null,
     deleted timestamptz not null default now()
   );
   create index keyward_keys_deleted_version on keyward_keys_deleted (version);
   create function keyward_keys_lock() returns trigger language plpgsql as $$
   begin
     perform pg_advisory_xact_lock(${WRITE_LOCK});
     return null;
   end $$;
   create function keyward_keys_stamp() returns trigger language plpgsql as $$
   begin
     if tg_op = 'UPDATE' then
       if (old.id, old.name, old.digest, old.created, old.expires, old.revoked, old.routes, old.previous)
          is not distinct from (new.id, new.name, new.digest, new.created, new.expires, new.revoked, new.routes, new.previous) then
         return new;
       end if;
       if old.id <> new.id then
         insert into keyward_keys_deleted (id, version) values (old.id, nextval('keyward_keys_version'));
       end if;
     end if;
     new.version := nextval('keyward_keys_version');
     return new;
   end $$;
   create function keyward_keys_tombstone() returns trigger language plpgsql as $$
   begin
     insert into keyward_keys_deleted (id, version) values (old.id, nextval('keyward_keys_version'));
     return null;
   end $$;
   create function keyward_keys_truncate() returns trigger language plpgsql as $$
   begin
     perform pg_advisory_xact_lock(${WRITE_LOCK});
     insert into keyward_keys_deleted (id, version) select id, nextval('keyward_keys_version') from keyward_keys;
     return null;
   end $$;
   create function keyward_keys_notify() returns trigger language plpgsql as $$
   declare v bigint;
   begin
     -- Tombstones are needed only until every gateway has fetched them (a
     -- second); a gateway away for longer reloads in full when it is back.
     delete from keyward_keys_deleted where deleted < now() - interval '1 day';
     if current_setting('keyward.writer', true) = 'on' then
       return null; -- keyward's own writes announce themselves, naming the keys
     end if;
     begin
       v := currval('keyward_keys_version');
     exception when object_not_in_prerequisite_state then
       v := null; -- nothing drawn in this session: the payload names no version, gateways fetch
     end;
     perform pg_notify('${CHANNEL}', json_build_object('version', v::text)::text);
     return null;
   end $$;
   create trigger keyward_keys_lock before insert or delete or update of id, name, digest, created, expires, revoked, routes, previous, version
     on keyward_keys for each statement execute procedure keyward_keys_lock();
   create trigger keyward_keys_stamp before insert or update of id, name, digest, created, expires, revoked, routes, previous, version
     on keyward_keys for each row execute procedure keyward_keys_stamp();
   create trigger keyward_keys_tombstone after delete on keyward_keys for each row execute procedure keyward_keys_tombstone();
   create trigger keyward_keys_truncate before truncate on keyward_keys for each statement execute procedure keyward_keys_truncate();
   create trigger keyward_keys_notify after insert or delete or truncate or update of id, name, digest, created, expires, revoked, routes, previous, version
     on keyward_keys for each statement execute procedure keyward_keys_notify();`,
];

interface Row {
  id: string;
  name: string;
  digest: string;
  created: Date;
  expires: Date | null;
  revoked: Date | null;
  routes: string[] | null;
  previous: unknown;
  version: string;
  /** The row's hash (ROW_HASH), for the consistency check. */
  h: string;
}

const COLUMNS = 'id, name, digest, created, expires, revoked, routes, previous, version';

/** Every key, in creation order: the whole set a load, a resync and a write start from. */
const allRows = (sql: postgres.Sql | postgres.TransactionSql, hashed = false): Promise<Row[]> =>
  sql<Row[]>`select ${sql.unsafe(COLUMNS)}${sql.unsafe(hashed ? `, ${ROW_HASH}::text as h` : '')} from keyward_keys order by created, id`;

/** The highest version drawn for a key or a tombstone: what a gateway compares with the one it holds. */
const TOP = `greatest((select max(version) from keyward_keys), (select max(version) from keyward_keys_deleted))::text`;
/**
 * A 64-bit hash of a row's stored fields. The table's checksum is the sum of
 * its rows' hashes; a gateway keeps each held row's hash, so it knows the
 * sum its own set should have without asking, and a sum that differs means
 * a change it was never told of.
 */
const ROW_HASH = `hashtextextended((${COLUMNS})::text, 0)`;
const CHECKSUM = `coalesce(sum(${ROW_HASH}), 0)::text`;

const iso = (d: Date | null): string | null => (d === null ? null : d.toISOString());

/** The row as a key record, unchecked: `previous` is whatever JSON the row holds. */
function toRecord(r: Row): KeyRecord {
  const rec: KeyRecord = { id: r.id, name: r.name, digest: r.digest, created: r.created.toISOString(), expires: iso(r.expires), revoked: iso(r.revoked) };
  const previous = Array.isArray(r.previous) && r.previous.length === 0 ? {} : { previous: r.previous as KeyRecord['previous'] };
  return { ...rec, ...(r.routes === null ? {} : { routes: r.routes }), ...previous };
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
    let stopped = false;
    // What is in force: the valid records (creation order, new keys last),
    // their positions by id and row hashes by position, the rows skipped as
    // invalid (id → problem, hash), the highest version applied and the
    // table's checksum at that version. Changed only once onChange accepted
    // the new set.
    let records: KeyRecord[] = [];
    let hashes: BigInt64Array = new BigInt64Array(0);
    let index = new Map<string, number>();
    let invalid = new Map<string, { problem: string; h: bigint }>();
    let version = -1n;
    let sum = 0n;
    // An apply failed: the next check reloads in full rather than trusting the held state.
    let dirty = false;
    let up = true;
    let busy: Promise<void> = Promise.resolve();
    const status = (now: boolean, err?: Error): void => {
      if (now !== up) {
        up = now;
        onStatus?.(now, err);
      }
    };
    interface Held {
      records: KeyRecord[];
      hashes: BigInt64Array;
      index: Map<string, number>;
      invalid: Map<string, { problem: string; h: bigint }>;
      version: bigint;
      sum: bigint;
    }
    const put = (next: Held): void => {
      const invalidChanged = next.invalid.size !== invalid.size || [...next.invalid.keys()].some((id) => !invalid.has(id));
      if (!stopped) onChange(next.records);
      ({ records, hashes, index, invalid, version, sum } = next);
      dirty = false;
      if (invalidChanged && !stopped) onInvalid?.(new Map([...invalid].map(([id, v]) => [id, v.problem])));
    };
    const full = async (): Promise<void> => {
      await this.migrate();
      const { rows, top } = await this.#snapshot(async (tx) => {
        const [[mark], all] = await Promise.all([tx<Array<{ top: string | null }>>`select ${tx.unsafe(TOP)} as top`, allRows(tx, true)]);
        return { rows: all, top: BigInt(mark?.top ?? '0') };
      });
      const next: Held = { records: [], hashes: new BigInt64Array(rows.length), index: new Map(), invalid: new Map(), version: top, sum: 0n };
      for (const row of rows) {
        const rec = toRecord(row);
        const h = BigInt(row.h);
        next.sum += h;
        const problem = recordProblem(rec);
        if (problem !== null) next.invalid.set(row.id, { problem, h });
        else {
          next.hashes[next.records.length] = h;
          next.index.set(rec.id, next.records.length);
          next.records.push(rec);
        }
      }
      put(next);
    };
    const since = async (): Promise<void> => {
      const from = version.toString();
      const { rows, dead } = await this.#snapshot(async (tx) => {
        const [changed, deleted] = await Promise.all([
          tx<Row[]>`select ${tx.unsafe(COLUMNS)}, ${tx.unsafe(ROW_HASH)}::text as h from keyward_keys where version > ${from} order by version`,
          tx<Array<{ id: string; version: string }>>`select id, version::text from keyward_keys_deleted where version > ${from} order by version`,
        ]);
        return { rows: changed, dead: deleted };
      });
      if (rows.length === 0 && dead.length === 0) return;
      // Rows and tombstones in version order: a key deleted and created again ends up present.
      const events: Array<{ v: bigint; row?: Row; gone?: string }> = [...rows.map((row) => ({ v: BigInt(row.version), row })), ...dead.map((d) => ({ v: BigInt(d.version), gone: d.id }))];
      events.sort((a, b) => (a.v < b.v ? -1 : a.v > b.v ? 1 : 0));
      let next: Array<KeyRecord | null> = records.slice();
      let nextHashes = new BigInt64Array(records.length + rows.length);
      nextHashes.set(hashes.subarray(0, records.length));
      // The index is changed in place (copying a million entries per change
      // would cost more than the change): if the set is then not put in
      // force, `dirty` makes the next check rebuild everything from scratch.
      const nextIndex = index;
      const nextInvalid = new Map(invalid);
      let nextSum = sum;
      let removed = false;
      let top = version;
      for (const e of events) {
        if (e.v > top) top = e.v;
        const rec = e.row === undefined ? null : toRecord(e.row);
        const id = rec?.id ?? (e.gone as string);
        const at = nextIndex.get(id);
        // The row's old hash leaves the sum; its new one (if it still exists) enters it.
        nextSum -= at !== undefined ? (nextHashes[at] as bigint) : (nextInvalid.get(id)?.h ?? 0n);
        nextInvalid.delete(id);
        const h = e.row === undefined ? 0n : BigInt(e.row.h);
        nextSum += h;
        const problem = rec === null ? null : recordProblem(rec);
        if (rec !== null && problem === null) {
          const to = at ?? next.length;
          if (at === undefined) {
            nextIndex.set(id, to);
            next.push(rec);
          } else next[to] = rec;
          nextHashes[to] = h;
          continue;
        }
        if (problem !== null) nextInvalid.set(id, { problem, h });
        if (at !== undefined) {
          // Deleted, or changed into a row that fails the check: it opens nothing from now on.
          next[at] = null;
          nextIndex.delete(id);
          removed = true;
        }
      }
      if (removed) {
        const kept: KeyRecord[] = [];
        const keptHashes = new BigInt64Array(next.length);
        nextIndex.clear();
        for (let i = 0; i < next.length; i++) {
          const r = next[i];
          if (r === null || r === undefined) continue;
          keptHashes[kept.length] = nextHashes[i] as bigint;
          nextIndex.set(r.id, kept.length);
          kept.push(r);
        }
        next = kept;
        nextHashes = keptHashes;
      }
      put({ records: next as KeyRecord[], hashes: nextHashes, index: nextIndex, invalid: nextInvalid, version: top, sum: nextSum });
    };
    // One at a time, in order: a full reload and an increment never interleave.
    const serial = (work: () => Promise<void>): void => {
      busy = busy.then(work).then(
        () => status(true),
        (err: Error) => {
          dirty = true;
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
            if (dirty) await full();
            else if (announced === null || announced > version) await since();
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
    // The periodic check: reachability, any change a notification missed,
    // and (every tenth) a change made with the triggers switched off.
    let ticks = 0;
    const check = setInterval(() => {
      if (listening === null) return;
      const consistency = ++ticks % CONSISTENCY_EVERY === 0;
      serial(async () => {
        if (dirty) return full();
        if (!consistency) {
          const [row] = await this.#sql<Array<{ v: string | null }>>`select ${this.#sql.unsafe(TOP)} as v`;
          if (row?.v !== null && row?.v !== undefined && BigInt(row.v) > version) await since();
          return;
        }
        const [row] = await this.#sql<Array<{ top: string | null; n: number; sum: string }>>`select ${this.#sql.unsafe(TOP)} as top, count(*)::int as n, ${this.#sql.unsafe(CHECKSUM)} as sum from keyward_keys`;
        if (row === undefined) return;
        if (BigInt(row.top ?? '0') > version) return since();
        // Same version, yet not the rows held: changed with the triggers off (or by a restore).
        if (row.n !== records.length + invalid.size || BigInt(row.sum) !== sum) return full();
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
