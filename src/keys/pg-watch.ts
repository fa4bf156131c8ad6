// Following the keys table from one gateway (docs/fleet.md, "How a change
// travels"): subscribe, reload in full after every (re)connect, fetch only
// what changed on a notice, check once a second, and compare the count and
// checksum every tenth. The set held here is the one in force: it moves
// forward only once onChange has accepted it.
import type postgres from 'postgres';
import type { KeyRecord } from './keyset.ts';
import { allRows, CHANNEL, CHECKSUM, noticeVersion, ROW_HASH, SELECTED, TOP, toRecord, type Row } from './pg-schema.ts';
import { recordProblem } from './record.ts';

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
export function reconnectDelayMs(retries: number): number {
  const cap = Math.min(RECONNECT_MAX_MS, 50 * 2 ** Math.max(0, retries));
  return cap * (0.5 + Math.random() / 2);
}
const RECONNECT_MAX_MS = 1_000;

export interface Db {
  /** The routes a key's budget may name (routes.ts), for the record check. */
  readonly costRoutes: readonly string[];
  /** The pool in use; a new one after a query passed its deadline. */
  sql(): postgres.Sql;
  migrate(): Promise<unknown>;
  /** `work` with a deadline (the longer one for reads of the whole set); past it the pool is replaced. */
  within<T>(work: (sql: postgres.Sql) => Promise<T>, full?: boolean): Promise<T>;
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

/** Follow the table until the returned `stop` is called. */
export function watchTable(db: Db, { onChange, onError, onStatus, onInvalid, onWarning }: Handlers): () => void {
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
  // The version sequence's value at the last full reload; see the periodic check.
  let reloadedAt = -1n;
  let warnedBack = false;
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
    await db.migrate();
    const { rows, top, seq } = await db.snapshot(async (tx) => {
      const [[mark], all] = await Promise.all([tx<Array<{ top: string | null; seq: string }>>`select ${tx.unsafe(TOP)} as top, ${tx.unsafe(SEQUENCE)} as seq`, allRows(tx, true)]);
      return { rows: all, top: BigInt(mark?.top ?? '0'), seq: BigInt(mark?.seq ?? '0') };
    }, true);
    reloadedAt = seq;
    const next: Held = { records: [], hashes: new BigInt64Array(rows.length), index: new Map(), invalid: new Map(), version: top, sum: 0n };
    for (const row of rows) {
      const rec = toRecord(row);
      const h = BigInt(row.h);
      next.sum += h;
      const problem = recordProblem(rec, db.costRoutes);
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
    const { rows, dead } = await db.snapshot(async (tx) => {
      const [changed, deleted] = await Promise.all([
        tx<Row[]>`select ${tx.unsafe(SELECTED)}, ${tx.unsafe(ROW_HASH)}::text as h from keyward_keys where version > ${from} order by version`,
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
      const problem = rec === null ? null : recordProblem(rec, db.costRoutes);
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
  // The pool the subscription lives on: a replaced pool (a query passed its deadline) means subscribing again.
  let listenedOn: postgres.Sql | null = null;
  let retry: NodeJS.Timeout | null = null;
  const subscribe = (): void => {
    const sql = db.sql();
    listenedOn = sql;
    sql
      .listen(
        CHANNEL,
        (payload) => serial(async () => {
          // Already held (the periodic check or an earlier notice got there first): nothing to fetch.
          const announced = noticeVersion(payload);
          if (dirty) await full();
          else if (announced === null || announced > version) await since();
          // With the sequence set back, a change announces a version below the one held.
          else if (warnedBack) await full();
        }),
        () => serial(full),
      ) // onlisten: every (re)subscribe, then a full reload
      .then((l) => {
        attempt = 0;
        listening = l;
        if (stopped) void l.unlisten().catch(() => undefined);
      })
      .catch((err: Error) => {
        status(false, err);
        if (stopped || listenedOn !== sql) return;
        listenedOn = null;
        const delay = reconnectDelayMs(attempt++);
        retry = setTimeout(subscribe, delay);
        retry.unref();
      });
  };
  subscribe();
  // The periodic check: reachability, any change a notification missed,
  // and (every tenth) a change made with the triggers switched off. It runs
  // beside the serial work, not behind it, with its own deadline: a store
  // that does not answer is down within KEYWARD_DATABASE_TIMEOUT whatever a
  // slower read is waiting for.
  let ticks = 0;
  let pinging = false;
  let counting = false;
  // Every tenth check, whether the rows are the ones held (a change made with
  // the triggers off, or a restore). It reads the whole table, so it gets the
  // whole-set deadline and runs on its own: on a loaded machine a count and
  // checksum of a million rows can outlast the liveness deadline, which would
  // drop the pool and read the million keys again for nothing.
  const consistencyCheck = (): void => {
    if (counting) return;
    counting = true;
    db.within(async (sql) => {
      const [row] = await sql<Array<{ top: string | null; n: number; sum: string | null }>>`select ${sql.unsafe(TOP)} as top, (select count(*)::int from keyward_keys) as n, (select ${sql.unsafe(CHECKSUM)} from keyward_keys) as sum`;
      return row;
    }, true)
      .then(
        (row) => {
          if (row === undefined || stopped || dirty || warnedBack) return;
          // Only at the version held: a newer one is the next check's to fetch.
          if (BigInt(row.top ?? '0') !== version) return;
          if (row.n !== records.length + invalid.size || BigInt(row.sum ?? '0') !== sum) serial(full);
        },
        (err: Error) => {
          status(false, err);
          if (!stopped) onError(err);
        },
      )
      .finally(() => {
        counting = false;
      });
  };
  const check = setInterval(() => {
    if (listenedOn !== null && listenedOn !== db.sql()) {
      // The pool was replaced: the subscription went with the old one.
      listening = null;
      subscribe();
    }
    if (listening === null || pinging) return;
    const consistency = ++ticks % CONSISTENCY_EVERY === 0;
    pinging = true;
    db.within(async (sql) => {
      const [row] = await sql<Array<{ top: string | null; seq: string }>>`select ${sql.unsafe(TOP)} as top, ${sql.unsafe(SEQUENCE)} as seq`;
      return row;
    })
      .then(
        (row) => {
          if (row === undefined || stopped) return;
          const seq = BigInt(row.seq);
          if (seq < version) {
            // The sequence was set back (setval): new versions fall at or
            // below the one held and no increment would fetch them. Each
            // time it moves, the whole set is read again, until it passes
            // the highest version.
            if (!warnedBack) {
              warnedBack = true;
              onWarning?.('the key version sequence is behind the highest version; every key change is read in full until it is set forward', { sequence: seq.toString(), highest: version.toString(), fix: `select setval('keyward_keys_version', ${version.toString()})` });
            }
            if (seq !== reloadedAt || dirty) serial(full);
            return;
          }
          warnedBack = false;
          if (dirty) return serial(full);
          // Answered, and what is held is in force: up (after a failed check, say).
          status(true);
          if (BigInt(row.top ?? '0') > version) return serial(since);
          if (consistency) consistencyCheck();
        },
        (err: Error) => {
          status(false, err);
          if (!stopped) onError(err);
        },
      )
      .finally(() => {
        pinging = false;
      });
  }, CHECK_MS);
  check.unref();
  return () => {
    stopped = true;
    clearInterval(check);
    if (retry !== null) clearTimeout(retry);
    if (listening !== null) void (listening as { unlisten(): Promise<void> }).unlisten().catch(() => undefined);
    listenedOn = null;
  };
}
