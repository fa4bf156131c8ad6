// The one place that chooses the usage ledger's store, as keys/open.ts does
// for keys (for a gateway, and for the commands that read it): the key store's own (PostgreSQL, shared by the fleet), else the
// SQLite file beside the keys file, else (that file cannot be opened)
// memory, said loudly.
import { existsSync, statSync } from 'node:fs';
import { DatabaseSync } from 'node:sqlite';
import type { KeyStore } from '../keys/store.ts';
import type { Logger } from '../observe/log.ts';
import { Clock, Leases, type CostShare } from '../limits/leases.ts';
import { UNWATCHED, type Outages } from '../observe/outages.ts';
import type { Ledger } from './ledger.ts';
import { MemoryUsageStore } from './memory-store.ts';
import { PgUsageStore } from './pg-usage.ts';
import { SqliteUsageStore, usagePath } from './sqlite-store.ts';
import { markPath, markProblem, readMark } from './sqlite-mark.ts';
import type { UsageStore } from './store.ts';
import { asError } from '../lib/error.ts';

/** The ledger file exists but cannot be read; the message says how to recover. */
export class LedgerDamaged extends Error {
  constructor(path: string, problem: string) {
    super(
      `usage ledger ${path} cannot be read (${problem}). Stop the gateway, keep the file for inspection (mv ${path} ${path}.damaged; rm ${path}.mark) and start again: a new ledger starts from zero, so quotas and budgets count this period again from nothing; restore a backup instead to keep them (docs/operations.md, "Backing up the ledger")`,
    );
  }
}

/** The ledger kept in the key store's own database (PostgreSQL), or undefined: the key store keeps none. */
export function sharedUsageStore(store: KeyStore): PgUsageStore | undefined {
  return store.database === undefined ? undefined : new PgUsageStore(store.database, store.location);
}

export function openUsageStore(config: { readonly keysFile: string }, store: KeyStore, logger: Logger): UsageStore {
  const shared = sharedUsageStore(store);
  if (shared !== undefined) return shared;
  const path = usagePath(config.keysFile);
  const problem = damage(path);
  if (problem !== null) {
    // A ledger that was there and cannot be read is a fault, never a fresh ledger: its
    // quotas and budgets would start again from zero (docs/limits.md, "Limits under faults").
    logger.error(
      { usageLedger: path, problem },
      'usage ledger cannot be read; keys with a quota or budget get 503 ledger_unavailable until it is repaired or moved aside',
    );
    return damagedLedger(path, problem);
  }
  try {
    return new SqliteUsageStore(path);
  } catch (err) {
    // Serving matters more than the ledger: said loudly, and limits then count from zero after a restart.
    logger.error({ err, usageLedger: path }, 'usage ledger cannot be opened; counting in memory only');
    return new MemoryUsageStore();
  }
}

/** Why the ledger file at `path` cannot be used, or null (it is sound, or there is none yet). */
export function damage(path: string): string | null {
  // A ledger that was written here and is gone is a fault, not a fresh start (sqlite-mark.ts).
  const mark = readMark(path);
  if (!existsSync(path)) return mark === null ? null : `the file is missing, though ${markPath(path)} says a ledger was written here`;
  if (statSync(path).size === 0) return 'the file is empty (a ledger that was there is gone)';
  try {
    const db = new DatabaseSync(path, { readOnly: true });
    try {
      // Every page the schema and this period's totals need is read: a truncated or overwritten file fails here.
      const [r] = db.prepare('pragma quick_check(1)').all() as Array<{ quick_check: string }>;
      if (r?.quick_check !== 'ok') return `damaged: ${r?.quick_check ?? 'unknown'}`;
      if (mark !== null) return markProblem(db, mark);
    } finally {
      db.close();
    }
  } catch (err) {
    return asError(err).message;
  }
  return null;
}

/** A ledger that cannot be read: nothing is counted from it or written to it (counts are kept for a later start). */
function damagedLedger(path: string, problem: string): UsageStore {
  const fault = (): Promise<never> => Promise.reject(new Error(`usage ledger ${path} cannot be read (${problem})`));
  return { location: path, damaged: problem, add: fault, rows: () => Promise.resolve([]), close: () => Promise.resolve() };
}

/**
 * The ledger a command reads (`keyward usage`, `keys list`): the key store's
 * own (PostgreSQL), else the SQLite file beside the keys file when there is
 * one; null when nothing was ever counted. The caller closes it.
 */
export function readUsageStore(keysFile: string, store: KeyStore): UsageStore | null {
  const shared = sharedUsageStore(store);
  if (shared !== undefined) return shared;
  const path = usagePath(keysFile);
  const problem = damage(path);
  if (problem !== null) throw new LedgerDamaged(path, problem);
  return existsSync(path) ? new SqliteUsageStore(path) : null;
}

/**
 * `store` for a worker: it writes its counts and nothing else. The primary
 * decides limits (so a worker never reads totals back, however large the
 * ledger), keeps the heartbeat and holds the leases.
 */
export function writeOnly(store: UsageStore): UsageStore {
  return { location: store.location, add: (rows, batch) => store.add(rows, batch), rows: () => Promise.resolve([]), close: () => store.close() };
  // No alerts: the primary checks and fires them (it decides the limits).
}

/** `store` for the primary of workers: it reads totals and takes part in the fleet, and never writes counts (the workers do). */
export function countOnly(store: UsageStore): UsageStore {
  return {
    location: store.location,
    ...(store.damaged === undefined ? {} : { damaged: store.damaged }),
    ...(store.fleet === undefined ? {} : { fleet: store.fleet }),
    ...(store.alerts === undefined ? {} : { alerts: store.alerts }),
    ...(store.report === undefined ? {} : { report: store.report }),
    ...(store.leases === undefined ? {} : { leases: store.leases }),
    ...(store.runs === undefined ? {} : { runs: store.runs }),
    add: () => Promise.resolve(),
    rows: (filter) => store.rows(filter),
    close: () => store.close(),
  };
}

/**
 * A fleet's leases on quotas and budgets, when `store` is shared (PostgreSQL):
 * renewed at every flush, and the ledger counting days by the fleet's clock.
 * Null for a store of one machine.
 */
export async function fleetLeases(
  store: UsageStore,
  ledger: Ledger,
  config: { readonly leaseTtlMs: number; readonly usageFlushMs: number },
  clock = new Clock(),
  logger?: Logger,
  costs: CostShare | null = null,
  outages: Outages | null = null,
): Promise<Leases | null> {
  // A fleet's leases in PostgreSQL; one machine's in its SQLite file (none when counting in memory).
  const leaseStore = store.fleet?.leases ?? store.leases;
  if (leaseStore === undefined) return null;
  const leases = new Leases(leaseStore, ledger.id, clock, () => ledger.gateways, Math.max(1, Math.ceil(config.leaseTtlMs / 1000)), costs, {
    renewal: outages?.watch('lease_renewal') ?? UNWATCHED,
    claim: outages?.watch('lease_claim') ?? UNWATCHED,
  });
  ledger.now = () => clock.now();
  // Frozen or cut off past the TTL: its leases were swept (their units stay granted) and are written back now.
  leases.onLost = (count) =>
    logger?.warn(
      { leases: count },
      'leases found swept at renewal (this gateway was frozen or cut off past KEYWARD_LEASE_TTL); written back, their units were never handed out again',
    );
  await leases.start(config.usageFlushMs);
  return leases;
}
