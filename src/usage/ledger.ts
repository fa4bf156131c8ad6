// The usage ledger (docs/limits.md): per key, route and UTC day, what was
// forwarded and what the upstream said it cost. Counted in memory as
// requests complete, written to a store in batches (every
// KEYWARD_USAGE_FLUSH and at drain), never a write per request. A batch that
// cannot be written is kept and merged into the next: counts are never
// dropped and never written twice. The period totals that quotas and
// budgets read are the store's at start plus everything counted since.
import type { PeriodUse } from './limiter.ts';
import { periodOf, type Period } from './policy.ts';

export interface UsageRow {
  readonly keyId: string;
  readonly route: string;
  /** UTC day, `2026-11-23`. */
  readonly day: string;
  requests: number;
  s2xx: number;
  s3xx: number;
  s4xx: number;
  s5xx: number;
  /** Forwarded but no upstream status reached the client (the client left, the upstream failed). */
  other: number;
  /** Refused by the key's limits (429). */
  limited: number;
  bytesIn: number;
  bytesOut: number;
  cost: number;
}

/** The gateways sharing a ledger: each says it is alive and learns how many are. */
export interface FleetView {
  /** Mark this gateway alive; the number of live gateways, this one included. */
  heartbeat(id: string): Promise<number>;
  /** This gateway leaves the fleet (drain): the others take over its share at once. */
  leave(id: string): Promise<void>;
}

/** Where the ledger is kept: the SQLite file beside the keys file, or PostgreSQL. */
export interface UsageStore {
  readonly location: string;
  /** Set for a ledger shared by a fleet: totals are re-read at each flush and limits shared. */
  readonly fleet?: FleetView;
  /** Add these counts to the stored ones (additive upserts, one batch). */
  add(rows: readonly UsageRow[]): Promise<void>;
  /** Stored rows from `since` (a UTC day) on, optionally for one key or route. */
  rows(filter: { since?: string; keyId?: string; route?: string }): Promise<UsageRow[]>;
  close(): Promise<void>;
}

const COUNTS = ['requests', 's2xx', 's3xx', 's4xx', 's5xx', 'other', 'limited', 'bytesIn', 'bytesOut', 'cost'] as const;

function empty(keyId: string, route: string, day: string): UsageRow {
  return { keyId, route, day, requests: 0, s2xx: 0, s3xx: 0, s4xx: 0, s5xx: 0, other: 0, limited: 0, bytesIn: 0, bytesOut: 0, cost: 0 };
}

function merge(into: UsageRow, from: UsageRow): void {
  for (const c of COUNTS) into[c] += from[c];
}

export class Ledger implements PeriodUse {
  readonly #store: UsageStore;
  /** Counted, not yet written: key|route|day → row. */
  #pending = new Map<string, UsageRow>();
  /**
   * This month's totals known here (stored at start plus counted since), for
   * quotas and budgets: requests by `key|day` and `key|month`, cost by
   * `key|route|day` and `key|route|month`. One lookup per check.
   */
  readonly #totals = new Map<string, number>();
  #monthKey = '';
  #timer: NodeJS.Timeout | null = null;
  /** Live gateways sharing the keys' rates and concurrency (1 alone). */
  gateways = 1;
  readonly #id = `${process.pid}-${Math.random().toString(36).slice(2, 10)}`;
  #flushing: Promise<void> | null = null;
  /** Every failed write (`first`: the first since the last success, for a log said once per outage); `recovered` after one. */
  readonly #onError: (err: Error, first: boolean) => void;
  readonly #onRecovered: () => void;
  #failing = false;

  constructor(store: UsageStore, onError: (err: Error, first: boolean) => void, onRecovered: () => void = () => undefined) {
    this.#store = store;
    this.#onError = onError;
    this.#onRecovered = onRecovered;
  }

  /** Read this month's totals, then write every `flushMs`. */
  async start(flushMs: number, now = Date.now()): Promise<void> {
    const month = periodOf('month', now);
    this.#monthKey = month.key;
    try {
      for (const row of await this.#store.rows({ since: `${month.key}-01` })) this.#count(row);
    } catch {
      // A shared store may be down while a gateway starts (it serves anyway,
      // docs/fleet.md): the totals are read at the next flush that reaches it.
    }
    await this.#beat();
    this.#timer = setInterval(() => void this.#tick(), flushMs);
    this.#timer.unref();
  }

  /** Flush; with a fleet, re-read the period totals everyone wrote and say this gateway is alive. */
  async #tick(): Promise<void> {
    await this.flush();
    if (this.#store.fleet === undefined) return;
    try {
      await this.#refresh();
      await this.#beat();
    } catch {
      // The store is unreachable: the last totals stand until it is back (the flush says so).
    }
  }

  async #beat(): Promise<void> {
    const fleet = this.#store.fleet;
    if (fleet !== undefined) this.gateways = await fleet.heartbeat(this.#id).catch(() => this.gateways);
  }

  /** Totals = what the fleet has written this month + what this gateway has not written yet. */
  async #refresh(now = Date.now()): Promise<void> {
    const month = periodOf('month', now).key;
    const stored = await this.#store.rows({ since: `${month}-01` });
    this.#totals.clear();
    this.#monthKey = month;
    for (const row of stored) this.#count(row);
    for (const row of this.#pending.values()) this.#count(row);
  }

  /** A forwarded request, once it completed: its status (null: none reached the client), body bytes and reported cost. */
  record(keyId: string, route: string, status: number | null, bytesIn: number, bytesOut: number, cost: number, now = Date.now()): void {
    const cls = status === null || status < 200 || status > 599 ? 'other' : (`s${Math.floor(status / 100)}xx` as 's2xx' | 's3xx' | 's4xx' | 's5xx');
    const delta = empty(keyId, route, periodOf('day', now).key);
    delta.requests = 1;
    delta[cls] = 1;
    delta.bytesIn = bytesIn;
    delta.bytesOut = bytesOut;
    delta.cost = cost;
    this.#add(delta, now);
  }

  /** A request the key's limits refused. */
  limited(keyId: string, route: string, now = Date.now()): void {
    const delta = empty(keyId, route, periodOf('day', now).key);
    delta.limited = 1;
    this.#add(delta, now);
  }

  requests(keyId: string, period: Period, now: number): number {
    return this.#sum(keyId, null, period, now, 'requests');
  }

  cost(keyId: string, route: string, period: Period, now: number): number {
    return this.#sum(keyId, route, period, now, 'cost');
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

  /** The final flush (drain): stop the timer, write everything, close the store. */
  async stop(): Promise<void> {
    if (this.#timer !== null) clearInterval(this.#timer);
    await this.leave();
    await this.flush();
    // A write still failing at shutdown: one more try, then it is reported.
    if (this.#pending.size > 0) await this.#write();
    await this.#store.close().catch(() => undefined);
  }

  async #write(): Promise<void> {
    if (this.#pending.size === 0) return;
    const batch = this.#pending;
    this.#pending = new Map();
    try {
      await this.#store.add([...batch.values()]);
      if (this.#failing) {
        this.#failing = false;
        this.#onRecovered();
      }
    } catch (err) {
      // Kept, and merged with what came meanwhile: written once, by a later flush.
      for (const [k, row] of batch) {
        const now = this.#pending.get(k);
        if (now === undefined) this.#pending.set(k, row);
        else merge(now, row);
      }
      this.#onError(err as Error, !this.#failing);
      this.#failing = true;
    }
  }

  #add(delta: UsageRow, now: number): void {
    this.#row(this.#pending, delta.keyId, delta.route, delta.day, delta);
    const month = periodOf('month', now).key;
    if (month !== this.#monthKey) {
      this.#totals.clear();
      this.#monthKey = month;
    }
    this.#count(delta);
  }

  #count(row: UsageRow): void {
    const month = row.day.slice(0, 7);
    for (const k of [`${row.keyId}\u0000${row.day}`, `${row.keyId}\u0000${month}`]) this.#totals.set(`r${k}`, (this.#totals.get(`r${k}`) ?? 0) + row.requests);
    if (row.cost === 0) return;
    for (const k of [`${row.keyId}\u0000${row.route}\u0000${row.day}`, `${row.keyId}\u0000${row.route}\u0000${month}`]) this.#totals.set(`c${k}`, (this.#totals.get(`c${k}`) ?? 0) + row.cost);
  }

  #row(map: Map<string, UsageRow>, keyId: string, route: string, day: string, add: UsageRow): void {
    const k = `${keyId}\u0000${route}\u0000${day}`;
    let row = map.get(k);
    if (row === undefined) {
      row = empty(keyId, route, day);
      map.set(k, row);
    }
    merge(row, add);
  }

  #sum(keyId: string, route: string | null, period: Period, now: number, field: 'requests' | 'cost'): number {
    const p = periodOf(period, now).key;
    if (p.slice(0, 7) !== this.#monthKey) return 0;
    const k = route === null ? `r${keyId}\u0000${p}` : `c${keyId}\u0000${route}\u0000${p}`;
    return field === 'requests' || route !== null ? (this.#totals.get(k) ?? 0) : 0;
  }
}

/** A store that keeps nothing past the process (no ledger file or table configured). */
export class MemoryUsageStore implements UsageStore {
  readonly location = 'memory';
  readonly #rows: UsageRow[] = [];

  add(rows: readonly UsageRow[]): Promise<void> {
    this.#rows.push(...rows.map((r) => ({ ...r })));
    return Promise.resolve();
  }

  rows(filter: { since?: string; keyId?: string; route?: string }): Promise<UsageRow[]> {
    return Promise.resolve(this.#rows.filter((r) => r.day >= (filter.since ?? '') && (filter.keyId === undefined || r.keyId === filter.keyId) && (filter.route === undefined || r.route === filter.route)));
  }

  close(): Promise<void> {
    return Promise.resolve();
  }
}
