// Where the usage ledger is kept, as the ledger and the stores both see it
// (docs/limits.md): a row per key, route and UTC day, the batch that wrote
// it, and what a store offers (SQLite beside the keys file, PostgreSQL for a
// fleet, memory). Types only: the ledger (ledger.ts), the stores and the
// usage page (report.ts) each import these, and none of them another.
import type { LeaseStore } from '../limits/leases.ts';
import type { PendingRun, RunStore } from './runs.ts';

/** Requests and the classes of their upstream statuses: a usage row's, a credential row's. */
export interface StatusCounts {
  requests: number;
  s2xx: number;
  s3xx: number;
  s4xx: number;
  s5xx: number;
  /** Forwarded but no upstream status reached the client (the client left, the upstream failed). */
  other: number;
}

export interface UsageRow extends StatusCounts {
  readonly keyId: string;
  readonly route: string;
  /** UTC day, `2026-11-23`. */
  readonly day: string;
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
  /** Where quotas and budgets are leased (PostgreSQL). */
  readonly leases?: LeaseStore;
}

/** Which batch: the gateway that counted it and its number there (1, 2, …, increasing). */
export interface BatchId {
  readonly gateway: string;
  readonly seq: number;
  /** Scraper runs started by this batch's requests: recorded as pending in the same write (runs.ts). */
  readonly runs?: readonly PendingRun[];
  /** Each credential's answers on routes with several (docs/credentials.md), written in the same transaction. */
  readonly credentials?: readonly CredentialRow[];
}

/** One credential's answers and cost on one UTC day (docs/credentials.md, "Seen"): each provider account's bill, checkable. */
export interface CredentialRow extends StatusCounts {
  readonly route: string;
  /** Its label: the credential's number. */
  readonly credential: number;
  readonly day: string;
  cost: number;
}

/** Where the ledger is kept: the SQLite file beside the keys file, or PostgreSQL. */
export interface UsageStore {
  readonly location: string;
  /** Set for a ledger shared by a fleet: totals are re-read at each flush and limits shared. */
  readonly fleet?: FleetView;
  /**
   * Add these counts to the stored ones (additive upserts, one transaction),
   * unless the store has applied this gateway's batch `seq` or a later one
   * already: then nothing, so that sending a batch again never doubles it.
   */
  add(rows: readonly UsageRow[], batch: BatchId): Promise<void>;
  /** The usage page's aggregates, when the store computes them itself (report.ts). */
  readonly report?: ReportQueries;
  /** Where alerts are recorded as fired, once per key, limit, period and threshold (alerts.ts). */
  readonly alerts?: AlertStore;
  /** Set when a ledger file exists but cannot be opened or read: why (ledger/open.ts). Nothing is read or written then. */
  readonly damaged?: string;
  /** Where one machine's quotas and budgets are leased before they are admitted (the SQLite file); a fleet's are `fleet.leases`. */
  readonly leases?: LeaseStore;
  /** Where scraper runs wait to be settled (runs.ts); absent: their start's booking stays (memory). */
  readonly runs?: RunStore;
  /** Stored credential rows from `since` (a UTC day) on, optionally for one route; absent: none kept (memory). */
  credentialRows?(filter: { since?: string; route?: string }): Promise<CredentialRow[]>;
  /** Stored rows from `since` (a UTC day) on, optionally for one key or route. */
  rows(filter: { since?: string; keyId?: string; route?: string }): Promise<UsageRow[]>;
  close(): Promise<void>;
}

export interface DayTotal {
  readonly day: string;
  readonly route: string;
  readonly requests: number;
  readonly cost: number;
}

export interface KeyTotal {
  readonly keyId: string;
  readonly route: string;
  readonly requests: number;
  readonly cost: number;
}

/** The aggregates a store may answer itself (SQLite, PostgreSQL); else they are made from its rows. */
export interface ReportQueries {
  /** Per day and route from `since` (a UTC day) on, optionally for one key or route. */
  daily(since: string, keyId: string | null, route: string | null): Promise<DayTotal[]>;
  /** Per key and route from `since` on; only `keyIds` when given. */
  byKey(since: string, keyIds: readonly string[] | null): Promise<KeyTotal[]>;
}

/** One firing as recorded in the store; `id` is unique per key, limit, period and threshold. */
export interface AlertRow {
  readonly id: string;
  readonly keyId: string;
  /** The webhook's body, sent again as it is. */
  readonly body: string;
  /** When it fired, ms since the epoch. */
  readonly at: number;
}

/** Where firings are recorded (the ledger's store: SQLite, PostgreSQL, or memory). */
export interface AlertStore {
  /** Record `alert` unless its id is recorded already: true when this call recorded it (and so fires it). */
  claimAlert(alert: AlertRow): Promise<boolean>;
  /** The webhook took it. */
  alertDelivered(id: string): Promise<void>;
  /**
   * Firings not yet delivered, fired since `since`, that no other process is
   * sending: each is marked as sent by `by` for `forMs`.
   */
  undeliveredAlerts(by: string, since: number, forMs: number): Promise<AlertRow[]>;
}
