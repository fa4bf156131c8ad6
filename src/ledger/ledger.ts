// The usage ledger (docs/limits.md): per key, route and UTC day, what was
// forwarded and what the upstream said it cost. Counted in memory as
// requests complete, written to a store in batches (every
// KEYWARD_USAGE_FLUSH and at drain), never a write per request. Each batch
// carries this gateway's id and a sequence number, and a store applies a
// batch once: one that cannot be written (or whose reply was lost) is sent
// again as it was, so counts are never dropped and never written twice.
// What a drain could not write is kept on local disk (spool.ts) and written
// at the next start. The period totals that quotas and budgets read are the
// store's at start plus everything counted since.
import { within } from '../lib/deadline.ts';
import type { PeriodUse } from '../limits/limiter.ts';
import { readSpool, writeSpool, type Batch, type Known, type SetAside } from './spool.ts';
import { periodOf, type Period } from '../limits/policy.ts';
import type { PendingRun } from './runs.ts';
import type { CredentialRow, StatusCounts, UsageRow, UsageStore } from './store.ts';
import { detach } from '../lib/detach.ts';
import { asError } from '../lib/error.ts';

/** How long, and how often, a final write that failed is tried again before its counts are kept on disk, ms. */
const STOP_RETRY_MS = 2_000;
const STOP_RETRY_EVERY_MS = 25;

/** Where a drain keeps unwritten usage (spool.ts), and what is said about it. */
export interface Spool {
  readonly prefix: string;
  /** At start: the files found, how many batches they held, and files that could not be read (left in place). */
  onRead(files: readonly string[], batches: number, bad: readonly string[], setAside: readonly SetAside[]): void;
  /** Whether a spooled row's key and route are known here (a reason when not). */
  readonly known?: Known;
  /** At a drain: usage not written by its deadline was kept in `file`, `requests` requests of it. */
  onKept(file: string, requests: number): void;
}

function empty(keyId: string, route: string, day: string): UsageRow {
  return { keyId, route, day, requests: 0, s2xx: 0, s3xx: 0, s4xx: 0, s5xx: 0, other: 0, limited: 0, bytesIn: 0, bytesOut: 0, cost: 0 };
}

/** A count for the current day and month, rolled over when they pass. */
interface Tally {
  day: string;
  month: string;
  inDay: number;
  inMonth: number;
}

/** One key's totals, kept per request with no string built: requests, and by route requests and cost. */
interface KeyTotals {
  readonly requests: Tally;
  readonly routes: Map<string, { readonly requests: Tally; readonly cost: Tally }>;
}

/** A key's requests and cost by route, today and this month (GET /keyward/key). */
export interface RouteUsage {
  readonly day: string;
  readonly month: string;
  /** Set when the store could not be read in time: the figures are as of `asOf` (null: never read) plus what was counted here since. */
  readonly stale?: { readonly asOf: string | null };
  readonly routes: ReadonlyMap<string, { readonly today: { requests: number; cost: number }; readonly month: { requests: number; cost: number } }>;
}

/** A key's usage by route from its rows (stored, and any counted since and not yet written). */
export function usageFrom(rows: readonly Pick<UsageRow, 'route' | 'day' | 'requests' | 'cost'>[], now: number): RouteUsage {
  const day = periodOf('day', now).key;
  const month = periodOf('month', now).key;
  const routes = new Map<string, { today: { requests: number; cost: number }; month: { requests: number; cost: number } }>();
  for (const r of rows) {
    if (!r.day.startsWith(month)) continue;
    let u = routes.get(r.route);
    if (u === undefined) routes.set(r.route, (u = { today: { requests: 0, cost: 0 }, month: { requests: 0, cost: 0 } }));
    u.month.requests += r.requests;
    u.month.cost += r.cost;
    if (r.day === day) {
      u.today.requests += r.requests;
      u.today.cost += r.cost;
    }
  }
  return { day, month, routes };
}

/** Period totals as a limiter reads them, from a key's usage by route. */
export function periodUse(u: RouteUsage): PeriodUse {
  const of = (period: 'day' | 'month'): 'today' | 'month' => (period === 'day' ? 'today' : 'month');
  return {
    requests: (_key, period) => {
      let n = 0;
      for (const r of u.routes.values()) n += r[of(period)].requests;
      return n;
    },
    cost: (_key, route, period) => u.routes.get(route)?.[of(period)].cost ?? 0,
  };
}

/** One request counted in a row, by the class of its upstream status (null or out of range: `other`). */
function countAnswer(row: StatusCounts, status: number | null): void {
  row.requests++;
  if (status === null || status < 200 || status > 599) row.other++;
  else if (status < 300) row.s2xx++;
  else if (status < 400) row.s3xx++;
  else if (status < 500) row.s4xx++;
  else row.s5xx++;
}

/** `t` rolled over to `day` and `month` (a count of a period that has passed starts again from 0). */
function rolled(t: Tally, day: string, month: string): Tally {
  if (t.month !== month) {
    t.month = month;
    t.inMonth = 0;
  }
  if (t.day !== day) {
    t.day = day;
    t.inDay = 0;
  }
  return t;
}

const current = (t: Tally | undefined, period: Period, now: number): number =>
  t === undefined ? 0 : period === 'day' ? (t.day === periodOf('day', now).key ? t.inDay : 0) : t.month === periodOf('month', now).key ? t.inMonth : 0;

export class Ledger implements PeriodUse {
  readonly #store: UsageStore;
  /** Counted, not yet written: key|route|day → row. */
  #pending = new Map<string, UsageRow>();
  /** Scraper runs started since the last flush, by id (a run is one run, however often it is named): written with the rows that booked them. */
  #runs = new Map<string, PendingRun>();
  /** Each credential's answers since the last flush (routes with several credentials). */
  #credentialRows = new Map<string, CredentialRow>();
  /** The pending row of each key and route for the current day, found with two lookups and no string. */
  #current = new Map<string, Map<string, UsageRow>>();
  /** This month's totals known here (stored, re-read in a fleet, plus counted since), for quotas and budgets. */
  readonly #totals = new Map<string, KeyTotals>();
  #timer: NodeJS.Timeout | null = null;
  /** Live gateways sharing the keys' rates and concurrency (1 alone). */
  gateways = 1;
  readonly #id = `${process.pid}-${Math.random().toString(36).slice(2, 10)}`;
  /** The time requests are counted at (a fleet's: the database's clock, leases.ts). */
  now: () => number = Date.now;
  /** Told how long each write held the event loop, in seconds (a SQLite write is synchronous; PostgreSQL's is not). */
  timed: (seconds: number) => void = () => undefined;
  /** Batches made and not yet written, oldest first (this gateway's, and any a drain kept on disk). */
  #queue: Batch[] = [];
  #seq = 0;
  /** Where a drain keeps what it could not write (null: nowhere), and the files read from there at start. */
  readonly #spool: Spool | null;
  #spooled: string[] = [];
  #flushing: Promise<void> | null = null;
  /** Every failed write (`first`: the first since the last success, for a log said once per outage); `recovered` after one. */
  readonly #onError: (err: Error, first: boolean) => void;
  readonly #onRecovered: () => void;
  #failing = false;

  constructor(store: UsageStore, onError: (err: Error, first: boolean) => void, onRecovered: () => void = () => undefined, spool: Spool | null = null) {
    this.#store = store;
    this.#onError = onError;
    this.#onRecovered = onRecovered;
    this.#spool = spool;
  }

  /** What a drain kept on disk is written first; then this month's totals are read, and the ledger written every `flushMs`. */
  async start(flushMs: number, now = Date.now()): Promise<void> {
    if (this.#spool !== null) {
      const kept = readSpool(this.#spool.prefix, this.#spool.known);
      this.#queue.push(...kept.batches);
      this.#spooled = kept.files;
      this.#spool.onRead(kept.files, kept.batches.length, kept.bad, kept.setAside);
      if (kept.batches.length > 0) await this.flush();
    }
    try {
      // A fleet's quotas and budgets are leased: its ledger is never read back (however large it grows).
      if (this.#store.fleet === undefined) for (const row of await this.#store.rows({ since: `${periodOf('month', now).key}-01` })) this.#count(row, now);
    } catch {
      // A shared store may be down while a gateway starts (it serves anyway,
      // docs/fleet.md): the totals are read at the next flush that reaches it.
    }
    await this.#beat();
    this.#timer = setInterval(() => detach(this.#tick(), (err) => this.#onError(asError(err), false)), flushMs);
    this.#timer.unref();
  }

  /**
   * Flush, and with a fleet say this gateway is alive. A fleet's quotas and
   * budgets are leased (leases.ts), so nothing here re-reads the ledger:
   * the work per flush does not grow with the ledger's size.
   */
  async #tick(): Promise<void> {
    await this.flush();
    await this.#beat();
  }

  async #beat(): Promise<void> {
    const fleet = this.#store.fleet;
    if (fleet !== undefined) this.gateways = await fleet.heartbeat(this.#id).catch(() => this.gateways);
  }

  /** This gateway's id in the fleet (heartbeats, batches, leases). */
  get id(): string {
    return this.#id;
  }

  /** A forwarded request, once it completed: its status (null: none reached the client), body bytes and reported cost. */
  record(
    keyId: string,
    route: string,
    status: number | null,
    bytesIn: number,
    bytesOut: number,
    cost: number,
    now = this.now(),
    run: { readonly id: string; readonly path: string; readonly credential?: number } | null = null,
  ): void {
    const row = this.#row(keyId, route, now);
    countAnswer(row, status);
    row.bytesIn += bytesIn;
    row.bytesOut += bytesOut;
    // Never a non-finite number in the ledger (the cost readers already refuse one; this holds whatever calls).
    if (!Number.isFinite(cost)) cost = 0;
    row.cost += cost;
    this.#counted(keyId, route, 1, cost, now);
    // A scraper run whose cost comes later: `cost` is what its start booked, settled in place later (runs.ts).
    if (run !== null && !this.#runs.has(run.id))
      this.#runs.set(run.id, { id: run.id, keyId, route, day: row.day, booked: cost, path: run.path, at: Math.round(now), credential: run.credential ?? 1 });
  }

  /**
   * One answer of a route's credential (routes with several; docs/credentials.md):
   * a request refused by it and sent again on another counts once for each.
   */
  credentialAnswer(route: string, credential: number, status: number | null, cost: number, now = this.now()): void {
    const day = periodOf('day', now).key;
    const k = `${route}\u0000${credential}\u0000${day}`;
    let row = this.#credentialRows.get(k);
    if (row === undefined) {
      row = { route, credential, day, requests: 0, s2xx: 0, s3xx: 0, s4xx: 0, s5xx: 0, other: 0, cost: 0 };
      this.#credentialRows.set(k, row);
    }
    countAnswer(row, status);
    if (Number.isFinite(cost)) row.cost += cost;
  }

  /** A run was settled: its day's cost moved by `delta` (in the store already), so the period totals move too. */
  adjust(keyId: string, route: string, day: string, delta: number, now = this.now()): void {
    if (!Number.isFinite(delta) || delta === 0 || !day.startsWith(periodOf('month', now).key)) return;
    this.#add(keyId, route, 0, delta, day === periodOf('day', now).key, now);
  }

  /** A request the key's limits refused. */
  limited(keyId: string, route: string, now = this.now()): void {
    this.#row(keyId, route, now).limited++;
  }

  requests(keyId: string, period: Period, now: number): number {
    return current(this.#totals.get(keyId)?.requests, period, now);
  }

  cost(keyId: string, route: string, period: Period, now: number): number {
    return current(this.#totals.get(keyId)?.routes.get(route)?.cost, period, now);
  }

  /** A key's requests and cost by route today and this month, as counted here (the store's at start plus everything since). */
  usage(keyId: string, now = this.now()): RouteUsage {
    const routes = new Map<string, { today: { requests: number; cost: number }; month: { requests: number; cost: number } }>();
    for (const [route, t] of this.#totals.get(keyId)?.routes ?? []) {
      const today = { requests: current(t.requests, 'day', now), cost: current(t.cost, 'day', now) };
      const month = { requests: current(t.requests, 'month', now), cost: current(t.cost, 'month', now) };
      if (month.requests > 0 || month.cost > 0) routes.set(route, { today, month });
    }
    return { day: periodOf('day', now).key, month: periodOf('month', now).key, routes };
  }

  /** This key's rows counted here and not yet in the store (pending, or in a batch not yet written). */
  unwritten(keyId: string): UsageRow[] {
    const out: UsageRow[] = [];
    for (const b of this.#queue) for (const r of b.rows) if (r.keyId === keyId) out.push(r);
    for (const r of this.#pending.values()) if (r.keyId === keyId) out.push(r);
    return out;
  }

  /** Write what was counted since the last flush; a failed write keeps it for the next. */
  flush(): Promise<void> {
    this.#flushing ??= this.#write().finally(() => {
      this.#flushing = null;
    });
    return this.#flushing;
  }

  /** Leave the fleet (the drain's first step): the others take this gateway's share at once. */
  leave(): Promise<void> {
    return this.#store.fleet?.leave(this.#id).catch(() => undefined) ?? Promise.resolve();
  }

  /**
   * The final flush (drain): stop the timer, leave the fleet, write
   * everything, close the store, all within `withinMs`. What could not be
   * written by then is kept on disk for the next start; the store may be
   * unreachable, and a drain never waits on it past its deadline.
   */
  async stop(withinMs = Infinity): Promise<void> {
    if (this.#timer !== null) clearInterval(this.#timer);
    const end = Date.now() + withinMs;
    const bounded = <T>(p: Promise<T>): Promise<T | undefined> => within(p, end - Date.now(), undefined);
    await bounded(this.leave());
    await bounded(this.flush());
    // A write still failing at shutdown is tried again for a moment, then
    // kept. The moment matters with workers: they drain together, and
    // SQLite refuses a second writer at once (no busy wait, sqlite-store.ts),
    // so one worker's final write meets the other's lock.
    const retryUntil = Math.min(end, Date.now() + STOP_RETRY_MS);
    while (this.#unwritten() && this.#flushing === null && Date.now() < retryUntil) {
      await new Promise((resolve) => setTimeout(resolve, STOP_RETRY_EVERY_MS));
      await bounded(this.flush());
    }
    this.#keep();
    await bounded(this.#store.close().catch(() => undefined));
  }

  #unwritten(): boolean {
    return this.#queue.length > 0 || this.#pending.size > 0 || this.#runs.size > 0 || this.#credentialRows.size > 0;
  }

  /** Keep what is not written yet on disk (a batch in flight too: applied once, whichever copy arrives first). */
  #keep(): void {
    if (this.#spool === null) return;
    const batches = [...this.#queue];
    if (this.#pending.size > 0 || this.#credentialRows.size > 0) batches.push(this.#batch());
    this.#pending = new Map();
    this.#current.clear();
    this.#queue = batches;
    if (batches.length === 0 && this.#spooled.length === 0) return;
    try {
      const file = writeSpool(this.#spool.prefix, this.#id, batches, this.#spooled);
      this.#spooled = file === null ? [] : [file];
      if (file !== null)
        this.#spool.onKept(
          file,
          batches.reduce((n, b) => n + b.rows.reduce((m, r) => m + r.requests, 0), 0),
        );
    } catch (err) {
      this.#onError(asError(err), true);
    }
  }

  async #write(): Promise<void> {
    if (this.#pending.size > 0 || this.#credentialRows.size > 0) {
      this.#queue.push(this.#batch());
      this.#pending = new Map();
      // Rows in the batch are no longer the ones to count into.
      this.#current.clear();
    }
    try {
      // Oldest first, each as it was made: a store skips a batch it applied already.
      while (this.#queue.length > 0) {
        const b = this.#queue[0] as Batch;
        const start = performance.now();
        const added = this.#store.add(b.rows, b);
        this.timed((performance.now() - start) / 1000);
        await added;
        this.#queue.shift();
      }
      if (this.#spool !== null && this.#spooled.length > 0) {
        writeSpool(this.#spool.prefix, this.#id, [], this.#spooled);
        this.#spooled = [];
      }
      if (this.#failing) {
        this.#failing = false;
        this.#onRecovered();
      }
    } catch (err) {
      // Kept, and sent again as it is by a later flush.
      this.#onError(asError(err), !this.#failing);
      this.#failing = true;
    }
  }

  /** What was counted since the last batch, as the next batch (the runs it started with it). */
  #batch(): Batch {
    const runs = [...this.#runs.values()];
    this.#runs.clear();
    const credentials = [...this.#credentialRows.values()];
    this.#credentialRows = new Map();
    return {
      gateway: this.#id,
      seq: ++this.#seq,
      rows: [...this.#pending.values()],
      ...(runs.length === 0 ? {} : { runs }),
      ...(credentials.length === 0 ? {} : { credentials }),
    };
  }

  /** The pending row of a key and route for today. */
  #row(keyId: string, route: string, now: number): UsageRow {
    const day = periodOf('day', now).key;
    let byRoute = this.#current.get(keyId);
    let row = byRoute?.get(route);
    if (row !== undefined && row.day === day) return row;
    const k = `${keyId}\u0000${route}\u0000${day}`;
    row = this.#pending.get(k);
    if (row === undefined) {
      row = empty(keyId, route, day);
      this.#pending.set(k, row);
    }
    if (byRoute === undefined) {
      byRoute = new Map();
      this.#current.set(keyId, byRoute);
    }
    byRoute.set(route, row);
    return row;
  }

  /** Count a stored row into the period totals. */
  #count(row: UsageRow, now: number): void {
    const month = periodOf('month', now).key;
    if (!row.day.startsWith(month)) return;
    const today = row.day === periodOf('day', now).key;
    this.#add(row.keyId, row.route, row.requests, row.cost, today, now);
  }

  #counted(keyId: string, route: string, requests: number, cost: number, now: number): void {
    this.#add(keyId, route, requests, cost, true, now);
  }

  #add(keyId: string, route: string, requests: number, cost: number, today: boolean, now: number): void {
    const day = periodOf('day', now).key;
    const month = periodOf('month', now).key;
    let t = this.#totals.get(keyId);
    if (t === undefined) {
      t = { requests: { day, month, inDay: 0, inMonth: 0 }, routes: new Map() };
      this.#totals.set(keyId, t);
    }
    const r = rolled(t.requests, day, month);
    r.inMonth += requests;
    if (today) r.inDay += requests;
    let byRoute = t.routes.get(route);
    if (byRoute === undefined) {
      byRoute = { requests: { day, month, inDay: 0, inMonth: 0 }, cost: { day, month, inDay: 0, inMonth: 0 } };
      t.routes.set(route, byRoute);
    }
    const rr = rolled(byRoute.requests, day, month);
    rr.inMonth += requests;
    if (today) rr.inDay += requests;
    if (cost === 0) return;
    const c = rolled(byRoute.cost, day, month);
    c.inMonth += cost;
    if (today) c.inDay += cost;
  }
}
