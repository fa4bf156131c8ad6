// keyward's tables in PostgreSQL (docs/fleet.md, "Schema"): the versioned
// migrations, the row shape and the queries the store and the watch share,
// and the change notice's wire format.
import type postgres from 'postgres';
import type { KeyRecord } from './keyset.ts';

export const CHANNEL = 'keyward_keys';
// Arbitrary constants naming keyward's advisory locks.
export const MIGRATION_LOCK = 0x6b657977; // "keyw"
export const WRITE_LOCK = 0x6b657978;

/**
 * A usage row's request and status counts, as migrations 4 (per key) and 10
 * (per credential) created them. Part of applied migrations: never edit it;
 * a new column is a new migration.
 */
const STATUS_COUNTS = `requests bigint not null default 0,
     s2xx bigint not null default 0,
     s3xx bigint not null default 0,
     s4xx bigint not null default 0,
     s5xx bigint not null default 0,
     other bigint not null default 0,`;

/**
 * The trigger function that gives an inserted or changed row the next
 * version (an update that leaves `columns` as they were keeps its version),
 * and leaves a tombstone for an id that changed.
 */
function stamp(verb: 'create' | 'create or replace', columns: readonly string[]): string {
  const row = (r: string): string => `(${columns.map((c) => `${r}.${c}`).join(', ')})`;
  return `${verb} function keyward_keys_stamp() returns trigger language plpgsql as $$
   begin
     if tg_op = 'UPDATE' then
       if ${row('old')}
          is not distinct from ${row('new')} then
         return new;
       end if;
       if old.id <> new.id then
         insert into keyward_keys_deleted (id, version) values (old.id, nextval('keyward_keys_version'));
       end if;
     end if;
     new.version := nextval('keyward_keys_version');
     return new;
   end $$;`;
}

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
   ${stamp('create', ['id', 'name', 'digest', 'created', 'expires', 'revoked', 'routes', 'previous'])}
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
  // 3: per-key limits (docs/limits.md), a column the triggers watch like the others.
  `alter table keyward_keys add column limits jsonb;
   ${stamp('create or replace', ['id', 'name', 'digest', 'created', 'expires', 'revoked', 'routes', 'previous', 'limits'])}
   drop trigger keyward_keys_lock on keyward_keys;
   drop trigger keyward_keys_stamp on keyward_keys;
   drop trigger keyward_keys_notify on keyward_keys;
   create trigger keyward_keys_lock before insert or delete or update of id, name, digest, created, expires, revoked, routes, previous, limits, version
     on keyward_keys for each statement execute procedure keyward_keys_lock();
   create trigger keyward_keys_stamp before insert or update of id, name, digest, created, expires, revoked, routes, previous, limits, version
     on keyward_keys for each row execute procedure keyward_keys_stamp();
   create trigger keyward_keys_notify after insert or delete or truncate or update of id, name, digest, created, expires, revoked, routes, previous, limits, version
     on keyward_keys for each statement execute procedure keyward_keys_notify();`,
  // 4: the usage ledger shared by the fleet, and the gateways alive in it (docs/limits.md).
  `create table keyward_usage (
     key_id text not null,
     route text not null,
     day date not null,
     ${STATUS_COUNTS}
     limited bigint not null default 0,
     bytes_in bigint not null default 0,
     bytes_out bigint not null default 0,
     cost double precision not null default 0,
     primary key (key_id, route, day)
   );
   create index keyward_usage_day on keyward_usage (day);
   create table keyward_gateways (
     id text primary key,
     seen timestamptz not null
   );`,
  // 5: flushes applied once. Each gateway numbers its batches; a batch at or
  // below the number recorded here was applied already (its reply was lost,
  // or it was kept on disk at a drain and is written again at the next start).
  `create table keyward_usage_batches (
     gateway text primary key,
     seq bigint not null,
     at timestamptz not null default now()
   );`,
  // 6: leases on quotas and budgets (docs/limits.md, "Across a fleet"). Per
  // key, limit and period, `granted` is what gateways were handed; each
  // gateway's lease says what it holds and has used, until it expires.
  `create table keyward_allowances (
     key_id text not null,
     kind text not null,
     period text not null,
     granted double precision not null default 0,
     primary key (key_id, kind, period)
   );
   create table keyward_leases (
     gateway text not null,
     key_id text not null,
     kind text not null,
     period text not null,
     held double precision not null,
     used double precision not null default 0,
     expires timestamptz not null,
     primary key (gateway, key_id, kind, period)
   );
   create index keyward_leases_expires on keyward_leases (expires);`,
  // 7: alerts fired (docs/limits.md, "Alerts"): one row per key, limit,
  // period and threshold, so each fires once across the fleet and restarts;
  // the webhook's body kept until it was delivered.
  `create table keyward_alerts (
     id text primary key,
     key_id text not null,
     body text not null,
     at timestamptz not null,
     delivered boolean not null default false,
     sender text,
     sending_until timestamptz not null default '-infinity'
   );
   create index keyward_alerts_undelivered on keyward_alerts (at) where not delivered;`,
  // 8: what a call costs per route, as the gateways learnt it (docs/limits.md,
  // "Across a fleet"): a cold gateway in a warm fleet reserves the fleet's
  // figure for its first budgeted call instead of nothing.
  `create table keyward_costs (
     route text primary key,
     per_call double precision not null,
     at timestamptz not null default now()
   );`,
  // 9: scraper runs whose cost comes when they end (docs/limits.md, "Scraper
  // runs"): recorded with the batch that booked their start, claimed by one
  // gateway at a time while it asks the upstream, deleted when settled.
  `create table keyward_runs (
     id text primary key,
     key_id text not null,
     route text not null,
     day date not null,
     booked double precision not null,
     path text not null,
     at timestamptz not null,
     attempts integer not null default 0,
     next_at timestamptz not null default '-infinity',
     claimed_by text,
     claimed_until timestamptz not null default '-infinity'
   );
   create index keyward_runs_due on keyward_runs (next_at);`,
  // 10: several credentials per route (docs/credentials.md): which are set
  // aside until when (401: 'infinity', until each gateway's next reload),
  // shared by every gateway; a scraper run's credential, asked about with
  // it; requests, statuses and cost per credential and day.
  `create table keyward_credentials_aside (
     route text not null,
     label integer not null,
     status integer not null,
     until timestamptz not null,
     at timestamptz not null default now(),
     primary key (route, label)
   );
   alter table keyward_runs add column credential integer not null default 1;
   create table keyward_credential_usage (
     route text not null,
     credential integer not null,
     day date not null,
     ${STATUS_COUNTS}
     cost double precision not null default 0,
     primary key (route, credential, day)
   );`,
  // 11: the audit log of key changes (docs/operations.md, "Audit log"): one
  // chain for the fleet, appended in the transaction that makes the change,
  // under the write lock that orders every change.
  `create table keyward_audit (
     seq bigint primary key,
     body text not null,
     hash text not null
   );`,
  // 12: the admin API (docs/admin-api.md): a key's external id (unique, a
  // column the triggers watch like the others) and the admin tokens, read on
  // every admin request (a revocation holds at once on every gateway).
  `alter table keyward_keys add column external_id text;
   create unique index keyward_keys_external_id on keyward_keys (external_id);
   ${stamp('create or replace', ['id', 'name', 'digest', 'created', 'expires', 'revoked', 'routes', 'previous', 'limits', 'external_id'])}
   drop trigger keyward_keys_lock on keyward_keys;
   drop trigger keyward_keys_stamp on keyward_keys;
   drop trigger keyward_keys_notify on keyward_keys;
   create trigger keyward_keys_lock before insert or delete or update of id, name, digest, created, expires, revoked, routes, previous, limits, external_id, version
     on keyward_keys for each statement execute procedure keyward_keys_lock();
   create trigger keyward_keys_stamp before insert or update of id, name, digest, created, expires, revoked, routes, previous, limits, external_id, version
     on keyward_keys for each row execute procedure keyward_keys_stamp();
   create trigger keyward_keys_notify after insert or delete or truncate or update of id, name, digest, created, expires, revoked, routes, previous, limits, external_id, version
     on keyward_keys for each statement execute procedure keyward_keys_notify();
   create table keyward_admins (
     id text primary key,
     name text not null,
     role text not null,
     digest text not null unique,
     created text not null,
     revoked text
   );`,
  // 13: the audit log's head as the store recorded it at each append, apart
  // from the log (keys/audit-check.ts): a log cut at its end no longer
  // reaches it. One row; seeded from the log as it stands.
  `create table keyward_audit_head (
     one boolean primary key default true check (one),
     seq bigint not null,
     hash text not null
   );
   insert into keyward_audit_head (seq, hash) select seq, hash from keyward_audit order by seq desc limit 1;`,
  // 14: capacity per credential shared by a fleet (docs/credentials.md,
  // "Capacity"): a row per credential and kind (slots of its concurrency,
  // units of its rate) that a rebalance locks, and each gateway's lease.
  `create table keyward_capacity (
     route text not null,
     label integer not null,
     kind text not null,
     primary key (route, label, kind)
   );
   create table keyward_capacity_leases (
     gateway text not null,
     route text not null,
     label integer not null,
     kind text not null,
     held integer not null,
     want integer not null,
     expires timestamptz not null,
     primary key (gateway, route, label, kind)
   );`,
];

export interface Row {
  id: string;
  name: string;
  digest: string;
  /** Instants as seconds since the epoch (INSTANT): ±Infinity for PostgreSQL's infinities. */
  created: number;
  expires: number | null;
  revoked: number | null;
  routes: string[] | null;
  previous: unknown;
  limits: unknown;
  external_id?: string | null;
  version: string;
  /** The row's hash (ROW_HASH), for the consistency check. */
  h: string;
}

/** The stored columns, as hashed (ROW_HASH). */
const COLUMNS = 'id, name, digest, created, expires, revoked, routes, previous, limits, external_id, version';

/**
 * A timestamptz read as seconds since the epoch (float8, microseconds in the
 * fraction; date_part is native float8, cheaper per row than numeric
 * extract on a million keys). postgres.js would turn
 * `infinity`, `-infinity` and years JavaScript cannot hold into an invalid
 * Date, whose conversion throws before the record check could judge the row
 * (docs/fleet.md, "Rows keyward would never write"); a float8 carries all of
 * them, infinities included.
 */
export const instant = (column: string): string => `date_part('epoch', ${column})`;

/** Seconds as read (INSTANT) to whole milliseconds, exactly: through microseconds, which a double holds for any date keyward writes. */
export const msOf = (seconds: number): number => (Number.isFinite(seconds) ? Math.floor(Math.round(seconds * 1e6) / 1000) : seconds);

/** The columns as read: instants as numbers (INSTANT), the rest as stored. */
export const SELECTED = `id, name, digest, ${['created', 'expires', 'revoked'].map((c) => `${instant(c)} as ${c}`).join(', ')}, routes, previous, limits, external_id, version`;

/** Every key, in creation order: the whole set a load, a resync and a write start from. */
export const allRows = (sql: postgres.Sql | postgres.TransactionSql, hashed = false): Promise<Row[]> =>
  sql<Row[]>`select ${sql.unsafe(SELECTED)}${sql.unsafe(hashed ? `, ${ROW_HASH}::text as h` : '')} from keyward_keys order by keyward_keys.created, id`;

/** The highest version drawn for a key or a tombstone: what a gateway compares with the one it holds. */
export const TOP = `greatest((select max(version) from keyward_keys), (select max(version) from keyward_keys_deleted))::text`;
/**
 * A 64-bit hash of a row's stored fields. The table's checksum is the sum of
 * its rows' hashes; a gateway keeps each held row's hash, so it knows the
 * sum its own set should have without asking, and a sum that differs means
 * a change it was never told of.
 */
export const ROW_HASH = `hashtextextended((${COLUMNS})::text, 0)`;
export const CHECKSUM = `coalesce(sum(${ROW_HASH}), 0)::text`;

/** The largest distance from the epoch a JavaScript Date holds, ms (ECMA-262, "Time Values and Time Range"). */
const DATE_RANGE_MS = 8.64e15;
/** What the record check refuses as "not a date": an instant JavaScript cannot place. */
export const UNPLACEABLE = 'not a date';
const EPOCH = new Date(0).toISOString();

/** An instant as ISO 8601, or UNPLACEABLE. */
export function isoInstant(ms: number): string {
  return Number.isFinite(ms) && Math.abs(ms) <= DATE_RANGE_MS ? new Date(Math.floor(ms)).toISOString() : UNPLACEABLE;
}

/**
 * An `expires` or `revoked` instant as the record holds it. Only "has it
 * passed?" matters for these, so an instant before 1970 is the epoch (an ISO
 * date PostgreSQL reads back, unlike JavaScript's `-000043-…`) and
 * `-infinity` is too: long past. `expires = infinity` is PostgreSQL's
 * spelling of "never" (null); `revoked = infinity` and years out of
 * JavaScript's range cannot be placed, so the row fails the record check
 * and opens nothing (fail closed).
 */
function deadline(ms: number | null, infinity: string | null): string | null {
  if (ms === null) return null;
  if (ms === Infinity) return infinity;
  if (ms < 0) return EPOCH;
  return isoInstant(ms);
}

/** The row as a key record, unchecked: `previous` is whatever JSON the row holds. */
export function toRecord(r: Row): KeyRecord {
  const rec: KeyRecord = {
    id: r.id,
    name: r.name,
    digest: r.digest,
    created: isoInstant(msOf(r.created)),
    expires: deadline(r.expires === null ? null : msOf(r.expires), null),
    revoked: deadline(r.revoked === null ? null : msOf(r.revoked), UNPLACEABLE),
  };
  const previous = Array.isArray(r.previous) && r.previous.length === 0 ? {} : { previous: r.previous as KeyRecord['previous'] };
  const limits = r.limits === null || r.limits === undefined ? {} : { limits: r.limits as KeyRecord['limits'] };
  const external = r.external_id === null || r.external_id === undefined ? {} : { externalId: r.external_id };
  return { ...rec, ...(r.routes === null ? {} : { routes: r.routes }), ...previous, ...limits, ...external };
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
