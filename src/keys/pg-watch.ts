// Following the keys table from one gateway (docs/fleet.md, "How a change
// travels"): subscribe, reload in full after every (re)connect, fetch only
// what changed on a notice, check once a second, and compare the count and
// checksum every tenth. The set held here is the one in force: it moves
// forward only once onChange has accepted it.
//
// The watch (`TableWatch`) is a set of named steps over a `Source` (the
// queries and the subscription), so a unit test drives its reconnects and
// reloads without a database; `pgSource` is the one over PostgreSQL.
import type postgres from 'postgres';
import { backoff } from '../lib/backoff.ts';
import { heldAfter, heldFrom, invalidChanged, NOTHING_HELD, type Held, type Tombstone } from './held.ts';
import type { KeyRecord } from './keyset.ts';
import { allRows, CHANNEL, CHECKSUM, noticeVersion, ROW_HASH, SELECTED, TOP, type Row } from './pg-schema.ts';

const CHECK_MS = 1_000;
/** The version sequence's last value: below the highest version held, it was set back. */
const SEQUENCE = `(select last_value from keyward_keys_version)::text`;
/** Every this many checks, the count and checksum are compared too (a full scan of the table). */
const CONSISTENCY_EVERY = 10;

/**
 * How long to wait before reconnect attempt `retries` (0 for the first):
 * doubling from 50 ms, capped at one second, each delay drawn uniformly from
 * its upper half. A gateway therefore notices a database that is back within
 * a second, and never tries more than twice a second: N gateways make at
 * most 2N connection attempts per second against a recovering server, spread
 * over the second rather than in step. (postgres.js's default grows to 20 s,
 * which left gateways blind for seconds after an outage.)
 */
export function reconnectDelayMs(retries: number, random: () => number = Math.random): number {
  return backoff(retries + 1, { firstMs: 50, maxMs: 1_000 }) * (0.5 + random() / 2);
}

export interface Db {
  /** The routes a key's budget may name (routes.ts), for the record check. */
  readonly costRoutes: readonly string[];
  /** The pool in use; a new one after a query passed its deadline. */
  sql(): postgres.Sql;
  migrate(): Promise<unknown>;
  /** `work` with a deadline (the longer one for reads of the whole set); past it the pool is replaced. */
  bounded<T>(work: (sql: postgres.Sql) => Promise<T>, full?: boolean): Promise<T>;
  /** Run `read` in one read-only snapshot, with a deadline. */
  snapshot<T>(read: (tx: postgres.TransactionSql) => Promise<T>, full?: boolean): Promise<T>;
}

export interface Handlers {
  onChange(records: readonly KeyRecord[]): void;
  onError(err: Error): void;
  onStatus?: ((up: boolean, err?: Error) => void) | undefined;
  onInvalid?: ((invalid: ReadonlyMap<string, string>) => void) | undefined;
  /** Something an operator should fix (a version sequence set back), said once per occurrence. */
  onWarning?: ((message: string, fields: Record<string, unknown>) => void) | undefined;
}

/** The highest version in the table and the version sequence's value. */
export interface Mark {
  readonly top: bigint;
  readonly seq: bigint;
}

/** What the watch reads and where it subscribes. */
export interface Source {
  readonly costRoutes: readonly string[];
  /** The pool in use: the subscription lives on it, and a new one means subscribing again. */
  pool(): object;
  /** Subscribe: `onNotice` per notification, `onListen` after every (re)subscribe. */
  listen(onNotice: (payload: string) => void, onListen: () => void): Promise<{ unlisten(): Promise<void> }>;
  /** Every row with its hash, the mark, in one snapshot (after migrating). */
  readAll(): Promise<{ rows: Row[]; mark: Mark }>;
  /** The rows changed and the keys deleted above `from`, in one snapshot. */
  readSince(from: bigint): Promise<{ rows: Row[]; dead: Tombstone[] }>;
  /** The mark, under the liveness deadline. */
  readMark(): Promise<Mark>;
  /** The row count and checksum at the highest version (a scan of the whole table). */
  readCensus(): Promise<{ top: bigint; n: number; sum: bigint }>;
}

const big = (s: string | null | undefined): bigint => BigInt(s ?? '0');

/** The queries over PostgreSQL. */
export function pgSource(db: Db): Source {
  return {
    costRoutes: db.costRoutes,
    pool: () => db.sql(),
    listen: (onNotice, onListen) => db.sql().listen(CHANNEL, onNotice, onListen),
    readAll: async () => {
      await db.migrate();
      return db.snapshot(async (tx) => {
        const [[mark], rows] = await Promise.all([
          tx<Array<{ top: string | null; seq: string }>>`select ${tx.unsafe(TOP)} as top, ${tx.unsafe(SEQUENCE)} as seq`,
          allRows(tx, true),
        ]);
        return { rows, mark: { top: big(mark?.top), seq: big(mark?.seq) } };
      }, true);
    },
    readSince: (from) =>
      db.snapshot(async (tx) => {
        const [rows, dead] = await Promise.all([
          tx<Row[]>`select ${tx.unsafe(SELECTED)}, ${tx.unsafe(ROW_HASH)}::text as h from keyward_keys where version > ${from.toString()} order by version`,
          tx<Tombstone[]>`select id, version::text from keyward_keys_deleted where version > ${from.toString()} order by version`,
        ]);
        return { rows, dead };
      }),
    readMark: () =>
      db.bounded(async (sql) => {
        const [row] = await sql<Array<{ top: string | null; seq: string }>>`select ${sql.unsafe(TOP)} as top, ${sql.unsafe(SEQUENCE)} as seq`;
        return { top: big(row?.top), seq: big(row?.seq) };
      }),
    // It reads the whole table, so it gets the whole-set deadline: on a loaded
    // machine a count and checksum of a million rows can outlast the liveness
    // deadline, which would drop the pool and read the million keys again for nothing.
    readCensus: () =>
      db.bounded(async (sql) => {
        const [row] = await sql<
          Array<{ top: string | null; n: number; sum: string | null }>
        >`select ${sql.unsafe(TOP)} as top, (select count(*)::int from keyward_keys) as n, (select ${sql.unsafe(CHECKSUM)} from keyward_keys) as sum`;
        return { top: big(row?.top), n: row?.n ?? 0, sum: big(row?.sum) };
      }, true),
  };
}

/** The watch's steps. Nothing runs until `subscribe`; `tick` is the once-a-second check. */
export class TableWatch {
  #held: Held = NOTHING_HELD;
  /** An apply failed: the next check reloads in full rather than trusting what is held. */
  #dirty = false;
  #up = true;
  #stopped = false;
  /** Reloads and increments, one at a time and in order: they never interleave. */
  #busy: Promise<void> = Promise.resolve();
  /** The version sequence's value at the last full reload; see `#marked`. */
  #reloadedAt = -1n;
  #warnedBack = false;
  #attempt = 0;
  #listening: { unlisten(): Promise<void> } | null = null;
  /** The pool the subscription lives on: a replaced pool means subscribing again. */
  #listenedOn: object | null = null;
  #retry: NodeJS.Timeout | null = null;
  #ticks = 0;
  #pinging = false;
  #counting = false;
  readonly #source: Source;
  readonly #on: Handlers;

  constructor(source: Source, handlers: Handlers) {
    this.#source = source;
    this.#on = handlers;
  }

  /** What is in force. */
  get held(): Held {
    return this.#held;
  }

  /** The work queued so far, done (for tests). */
  settled(): Promise<void> {
    return this.#busy;
  }

  subscribe(): void {
    const pool = this.#source.pool();
    this.#listenedOn = pool;
    this.#source
      .listen(
        (payload) => this.#serial(() => this.#notice(payload)),
        () => this.#serial(() => this.#full()),
      )
      .then(
        (l) => {
          this.#attempt = 0;
          this.#listening = l;
          if (this.#stopped) void l.unlisten().catch(() => undefined);
        },
        (err: Error) => this.#unsubscribed(pool, err),
      );
  }

  /**
   * The periodic check: reachability, any change a notification missed, and
   * (every tenth) a change made with the triggers switched off. It runs beside
   * the serial work, not behind it, with its own deadline: a store that does
   * not answer is down within KEYWARD_DATABASE_TIMEOUT whatever a slower read
   * is waiting for.
   */
  tick(): void {
    if (this.#listenedOn !== null && this.#listenedOn !== this.#source.pool()) {
      // The pool was replaced: the subscription went with the old one.
      this.#listening = null;
      this.subscribe();
    }
    if (this.#listening === null || this.#pinging) return;
    const consistency = ++this.#ticks % CONSISTENCY_EVERY === 0;
    this.#pinging = true;
    this.#source
      .readMark()
      .then(
        (mark) => this.#marked(mark, consistency),
        (err: Error) => this.#failed(err),
      )
      .finally(() => (this.#pinging = false));
  }

  stop(): void {
    this.#stopped = true;
    if (this.#retry !== null) clearTimeout(this.#retry);
    if (this.#listening !== null) void this.#listening.unlisten().catch(() => undefined);
    this.#listenedOn = null;
  }

  #unsubscribed(pool: object, err: Error): void {
    this.#status(false, err);
    if (this.#stopped || this.#listenedOn !== pool) return;
    this.#listenedOn = null;
    this.#retry = setTimeout(() => this.subscribe(), reconnectDelayMs(this.#attempt++));
    this.#retry.unref();
  }

  #status(up: boolean, err?: Error): void {
    if (up === this.#up) return;
    this.#up = up;
    this.#on.onStatus?.(up, err);
  }

  #failed(err: Error): void {
    this.#status(false, err);
    if (!this.#stopped) this.#on.onError(err);
  }

  #serial(work: () => Promise<void>): void {
    this.#busy = this.#busy.then(work).then(
      () => this.#status(true),
      (err: Error) => {
        this.#dirty = true;
        this.#failed(err);
      },
    );
  }

  #put(next: Held): void {
    if (next === this.#held) return;
    const before = this.#held;
    if (!this.#stopped) this.#on.onChange(next.records);
    this.#held = next;
    this.#dirty = false;
    if (invalidChanged(before, next) && !this.#stopped) this.#on.onInvalid?.(new Map([...next.invalid].map(([id, v]) => [id, v.problem])));
  }

  async #full(): Promise<void> {
    const { rows, mark } = await this.#source.readAll();
    this.#reloadedAt = mark.seq;
    this.#put(heldFrom(rows, mark.top, this.#source.costRoutes));
  }

  async #since(): Promise<void> {
    const { rows, dead } = await this.#source.readSince(this.#held.version);
    this.#put(heldAfter(this.#held, rows, dead, this.#source.costRoutes));
  }

  #notice(payload: string): Promise<void> {
    // Already held (the periodic check or an earlier notice got there first): nothing to fetch.
    const announced = noticeVersion(payload);
    if (this.#dirty) return this.#full();
    if (announced === null || announced > this.#held.version) return this.#since();
    // With the sequence set back, a change announces a version below the one held.
    return this.#warnedBack ? this.#full() : Promise.resolve();
  }

  #marked({ top, seq }: Mark, consistency: boolean): void {
    if (this.#stopped) return;
    const version = this.#held.version;
    if (seq < version) {
      // The sequence was set back (setval): new versions fall at or below the
      // one held and no increment would fetch them. Each time it moves, the
      // whole set is read again, until it passes the highest version.
      if (!this.#warnedBack) {
        this.#warnedBack = true;
        this.#on.onWarning?.('the key version sequence is behind the highest version; every key change is read in full until it is set forward', {
          sequence: seq.toString(),
          highest: version.toString(),
          fix: `select setval('keyward_keys_version', ${version.toString()})`,
        });
      }
      if (seq !== this.#reloadedAt || this.#dirty) this.#serial(() => this.#full());
      return;
    }
    this.#warnedBack = false;
    if (this.#dirty) return this.#serial(() => this.#full());
    // Answered, and what is held is in force: up (after a failed check, say).
    this.#status(true);
    if (top > version) return this.#serial(() => this.#since());
    if (consistency) this.#census();
  }

  /** Every tenth check, whether the rows are the ones held (a change made with the triggers off, or a restore). */
  #census(): void {
    if (this.#counting) return;
    this.#counting = true;
    this.#source
      .readCensus()
      .then(
        ({ top, n, sum }) => {
          const held = this.#held;
          if (this.#stopped || this.#dirty || this.#warnedBack) return;
          // Only at the version held: a newer one is the next check's to fetch.
          if (top !== held.version) return;
          if (n !== held.records.length + held.invalid.size || sum !== held.sum) this.#serial(() => this.#full());
        },
        (err: Error) => this.#failed(err),
      )
      .finally(() => (this.#counting = false));
  }
}

/** Follow the table until the returned `stop` is called. */
export function watchTable(db: Db, handlers: Handlers): () => void {
  const watch = new TableWatch(pgSource(db), handlers);
  watch.subscribe();
  const check = setInterval(() => watch.tick(), CHECK_MS);
  check.unref();
  return () => {
    clearInterval(check);
    watch.stop();
  };
}
