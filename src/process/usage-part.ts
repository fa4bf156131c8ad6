// A gateway's usage part (docs/limits.md): the ledger and its store, a
// fleet's leases, the limiter, and seeing spend (status, alerts) where this
// process decides limits; a worker asks its primary instead.
import type { Config } from '../config/load.ts';
import type { Room } from '../capacity/capacity.ts';
import type { Principal } from '../keys/keyset.ts';
import type { KeyStore } from '../keys/store.ts';
import type { Logger } from '../observe/log.ts';
import { backgroundFailures, type Metrics, type Registry } from '../observe/metrics.ts';
import type { Admit } from '../limits/admissions.ts';
import { StoreView, type StatusSources } from '../views/key-status.ts';
import { Ledger } from '../ledger/ledger.ts';
import type { Clock, Leases } from '../limits/leases.ts';
import { Limiter, mapDecision, withDone, type LimitState } from '../limits/limiter.ts';
import { fleetLeases, openUsageStore, writeOnly } from '../ledger/open.ts';
import { createSpend, fleetFigures, storeView, type Spend } from '../alerts/spend.ts';
import { RouteCosts } from '../limits/route-costs.ts';
import { spoolPrefix } from '../ledger/spool.ts';
import type { Limits } from '../keys/limits.ts';
import { policyFor } from '../limits/policy.ts';
import type { RunTarget } from '../ledger/run-ask.ts';
import type { Settler, SettlerOptions } from '../ledger/runs.ts';
import { runSettler, billedLaterRoutes } from './run-settler.ts';
import { costUnits } from './runtime.ts';
import type { UsageStore } from '../ledger/store.ts';
import { Outages } from '../observe/outages.ts';

export interface UsageOptions {
  /** Where the usage ledger is kept (default: the SQLite file beside the keys file). */
  readonly usageStore?: UsageStore;
  /**
   * Set in a worker of `KEYWARD_WORKERS` > 1: its primary decides limits
   * (limits/admissions.ts) and says where a key's limits stand, and the
   * worker only writes its counts. Absent: this process decides (one
   * gateway, or a fleet member), so it holds the leases, fires the alerts
   * and settles scraper runs.
   */
  readonly worker?: {
    readonly admit: Admit;
    /** Where a key's limits stand, asked of the primary (GET /keyward/key). */
    readonly limitStatus: (principal: Principal) => Promise<readonly LimitState[] | null>;
    /** Room on the routes' accounts, asked of the primary, which holds the counts for the machine (capacity/workers.ts). */
    readonly room?: Room;
  };
  /** The clock a fleet corrects by the database's. */
  readonly clock?: Clock;
  /** Every key id in the loaded set (spooled usage of another key is set aside); null: not known. */
  readonly keyIds?: () => ReadonlySet<string> | null;
  /** Where a route's upstream is now, to ask it about a scraper run (runs.ts); absent: runs are not settled here. */
  readonly runTarget?: (route: string, credential: number) => RunTarget | null;
  /** The settler's pace (runs.ts SETTLE): tests shorten it. */
  readonly settle?: Pick<SettlerOptions, 'everyMs' | 'backoff' | 'giveUpMs'>;
  /** A key's record by id (a settled run's alerts); null when not in the set. */
  readonly keyOf?: (keyId: string) => { readonly id: string; readonly name: string; readonly limits?: Limits } | null;
}

export interface UsagePart {
  readonly usageStore: UsageStore;
  readonly ledger: Ledger;
  readonly leases: Leases | null;
  readonly spend: Spend | null;
  readonly admit: Admit;
  readonly statusSources: StatusSources;
  readonly units: (route: string) => string | null;
  /** Books scraper runs' costs once they end (null: not this process, or no store keeps runs). */
  readonly settler: Settler | null;
  /** The background tasks failing now (lease renewals and claims, the settler, alert checks, usage reads); null in a worker, which runs none. */
  readonly outages: Outages | null;
}

/** The ledger started (what a drain kept written first), the leases claimed, the limiter and seeing spend ready. */
export async function startUsage(config: Config, store: KeyStore, logger: Logger, metrics: Metrics, options: UsageOptions): Promise<UsagePart> {
  const usageStore = options.usageStore ?? openUsageStore(config, store, logger);
  const worker = options.worker ?? null;
  /** The key ids, read once and only when kept usage is checked. */
  let ids: ReadonlySet<string> | null = null;
  const ledger = new Ledger(
    // A worker writes its counts; the primary decides limits and speaks for the machine in the fleet.
    worker === null ? usageStore : writeOnly(usageStore),
    (err, first) => {
      metrics.usageFlushFailed();
      // Said once per outage, not every flush.
      if (first) logger.warn({ err }, 'usage not written; kept and retried at every flush');
    },
    () => logger.info('usage written again'),
    {
      prefix: spoolPrefix(config.keysFile),
      onRead: (files, batches, bad, setAside) => {
        if (files.length > 0) logger.info({ files, batches }, 'usage kept by an earlier drain found; writing it');
        if (bad.length > 0) logger.error({ files: bad }, 'usage files that cannot be read left in place');
        for (const s of setAside) {
          metrics.usageSetAside(s.batches);
          logger.error({ file: s.file, batches: s.batches, reasons: s.reasons }, "kept usage that breaks the ledger's rules set aside, not written");
        }
      },
      known: (keyId, route) => {
        if (!config.routes.some((r) => r.name === route)) return `route ${route} is not one of this gateway's`;
        ids ??= options.keyIds?.() ?? null;
        // A credential row belongs to no key (keyId null): its route is all there is to check.
        return ids !== null && keyId !== null && !ids.has(keyId) ? `key ${keyId} is not in the key set` : null;
      },
      onKept: (file, requests) => logger.warn({ file, requests }, 'usage not written before the drain deadline; kept on disk and written at the next start'),
    },
  );
  ledger.timed = (seconds) => metrics.task('ledger_write', seconds);
  await ledger.start(config.usageFlushMs);
  const units = costUnits(config);
  // The process that decides limits answers where a key stands and fires its alerts; a worker asks its primary.
  const { leases, limiter, spend, outages } =
    worker === null
      ? await startDeciding(config, usageStore, ledger, logger, metrics.registry, units, options.clock)
      : { leases: null, limiter: new Limiter(ledger, { billedLater: billedLaterRoutes(config), waitMs: config.admissionWaitMs }), spend: null, outages: null };
  const admit: Admit =
    worker?.admit ??
    (spend === null ? (p, policy, route, now, start) => limiter.admit(p.id, policy, route, now, ledger.gateways, start) : alerting(limiter, ledger, spend));
  const statusSources: StatusSources =
    spend?.status ??
    (() => {
      // A worker: the others' counts are in the store (read at most once per flush), its own not yet written are added.
      const view = new StoreView(usageStore, ledger, config.usageFlushMs);
      const remote = worker?.limitStatus ?? (() => Promise.resolve(null));
      return { usage: (keyId, now) => view.usage(keyId, now), limits: (principal) => remote(principal) };
    })();
  const { runTarget, keyOf } = options;
  const settler =
    worker === null && runTarget !== undefined
      ? runSettler({
          config,
          store: usageStore,
          ledger,
          limiter,
          spend,
          logger,
          registry: metrics.registry,
          ...(outages === null ? {} : { watch: outages.watch('run_settling') }),
          target: runTarget,
          keyOf: (id) => {
            const record = keyOf?.(id) ?? null;
            const policy = record === null ? null : policyFor(record);
            return record === null || policy === null ? null : { key: record, policy };
          },
          ...(options.settle === undefined ? {} : { settle: options.settle }),
        })
      : null;
  return { usageStore, ledger, leases, spend, admit, statusSources, units, settler, outages };
}

/** Admission in this process, its alerts checked once a request that reached the upstream was counted. */
/**
 * What the process that decides limits holds: the leases (a fleet's, or one
 * machine's), the limiter that shares their costs per call and reads the
 * fleet's figures, and the spend it fires alerts for, started.
 */
export async function startDeciding(
  config: Config,
  usage: UsageStore,
  ledger: Ledger,
  logger: Logger,
  registry: Registry,
  units: (route: string) => string | null,
  clock?: Clock,
): Promise<{ leases: Leases | null; limiter: Limiter; spend: Spend; outages: Outages }> {
  // Each background task below is seen when it fails (docs/operations.md, "Background tasks").
  const failures = backgroundFailures(registry);
  const outages = new Outages(logger, (task) => failures.inc({ task }));
  const costs = new RouteCosts();
  const leases = await fleetLeases(usage, ledger, config, clock, logger, costs, outages);
  const view = storeView(usage, ledger, config.usageFlushMs, outages.watch('usage_read'));
  const limiter = new Limiter(ledger, {
    leases,
    costs,
    billedLater: billedLaterRoutes(config),
    waitMs: config.admissionWaitMs,
    fleet: view && fleetFigures(view),
  });
  const spend = createSpend({ config, store: usage, ledger, limiter, view, logger, outages, registry, unitOf: (r) => units(r) ?? 'usd' });
  await spend.start();
  return { leases, limiter, spend, outages };
}

function alerting(limiter: Limiter, ledger: Ledger, spend: Spend): Admit {
  return (principal, policy, route, now, start) => {
    const r = limiter.admit(principal.id, policy, route, now, ledger.gateways, start);
    if (policy.alerts.length === 0) return r;
    return mapDecision(r, (a) =>
      a.kind !== 'admitted'
        ? a
        : withDone(a, (reached, cost) => {
            a.done(reached, cost);
            if (reached) spend.counted(principal, policy);
          }),
    );
  };
}
