// The node:http(s) server around the pipeline: timeouts and limits, the
// events Node raises outside a normal request (parse errors, upgrades,
// CONNECT, `Expect: 100-continue`), live key and configuration reloads, and
// the drain on shutdown.
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { createCompletion } from '../request/completion.ts';
import { secretForms } from '../request/egress.ts';
import { unknownMessage, type Config } from '../config/load.ts';
import { GatewayRequest } from '../request/exchange.ts';
import { expire } from '../request/forward.ts';
import { KeyHolder } from '../keys/holder.ts';
import { LastUse } from '../keys/last-use.ts';
import type { Database, KeyStore } from '../keys/store.ts';
import { bindError } from './listen.ts';
import type { Logger } from '../observe/log.ts';
import { capacityMetrics, Metrics, type Registry } from '../observe/metrics.ts';
import { FleetShares } from '../capacity/fleet.ts';
import { PgShareStore } from '../capacity/pg-shares.ts';
import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';
import { Capacity, capacityStates, type CapacityState, type Room } from '../capacity/capacity.ts';
import { createPipeline, type Pipeline } from '../request/pipeline.ts';
import type { RunTarget } from '../ledger/run-ask.ts';
import { serveEvents } from './events.ts';
import { startUsage, type UsageOptions } from './usage-part.ts';
import type { Failing, Outages } from '../observe/outages.ts';
import { buildRuntime, idleReason, restartOnlyChanges, type Runtime } from './runtime.ts';
import { CredentialBoard, type Retry } from '../request/credentials.ts';
import { shareInFleet, shareWithPrimary } from './credential-share.ts';
import type { Ledger } from '../ledger/ledger.ts';
import { Sweeper } from '../request/timers.ts';
import { keyStatus } from '../views/key-status.ts';
import type { Principal } from '../keys/keyset.ts';
import { renderPage } from '../views/page.ts';
import { usagePage } from '../views/report.ts';
import { MemoryUsageStore } from '../ledger/memory-store.ts';
import { within } from '../lib/deadline.ts';
import { pageThread, pageSource } from '../views/page-thread.ts';
import type { UsageStore } from '../ledger/store.ts';
import { detach, neverRejects } from '../lib/detach.ts';

/** The least time the ledger and the key store get after the last connection closed, ms. */
const FINAL_WRITE_MS = 500;

export interface Readiness {
  readonly ready: boolean;
  readonly draining: boolean;
  /** Active keys in the loaded set; null when none could be loaded yet. */
  readonly keys: number | null;
  /** Keys whose rules this version cannot enforce (refused with 503 key_unsupported); absent when none. */
  readonly keysUnsupported?: number;
  /** The store is unreachable, or its last change could not be read, and the last good key set is serving. */
  readonly stale?: boolean;
  /** What is wrong with the store while a last good set serves (a keys file that stopped parsing). */
  readonly problem?: string;
  readonly reason?: string;
  /** Routes with several credentials: how many are available of how many (docs/credentials.md); absent when no route has several. */
  readonly credentials?: Readonly<Record<string, { readonly available: number; readonly total: number }>>;
  /** Routes whose every credential is set aside (requests there get 503 upstream_credentials_exhausted); absent when none. */
  readonly credentialsExhausted?: readonly string[];
  /** Routes with a capacity (docs/credentials.md, "Capacity"): requests in flight, the limit, requests waiting; absent when none has one. */
  readonly capacity?: Readonly<Record<string, CapacityState>>;
  /**
   * Background tasks failing now (docs/operations.md, "Background tasks"):
   * still ready, since requests are served, but a renewal or a run settler
   * that fails stops money being booked, and this is where it shows.
   */
  readonly failing?: readonly Failing[];
}

export interface Gateway {
  readonly server: http.Server;
  readonly metrics: Metrics;
  /** Start listening (on `listenFd` when systemd passed a socket); resolves with the bound address. */
  listen(): Promise<AddressInfo>;
  /** Stop accepting, let in-flight requests finish up to the drain deadline, close everything. */
  shutdown(): Promise<void>;
  /** Re-read the key store now (SIGHUP); keeps the current set if the store cannot be read. */
  reloadKeys(): Promise<void>;
  /** Apply a new configuration: new requests use it, requests in flight finish on the old one. */
  reconfigure(config: Config): void;
  readiness(): Readiness;
  keyCount(): number;
  /** The usage page (admin listener): from the ledger's store and the loaded keys. */
  usagePage(params: URLSearchParams): Promise<string>;
  /** What `GET /keyward/key` answers for `principal`, from this process's figures (the admin API's key view). */
  keyStatus(principal: Principal): Promise<unknown>;
}

export interface GatewayOptions extends UsageOptions {
  /** A listening socket inherited from systemd (LISTEN_FDS), used instead of binding host:port. */
  readonly listenFd?: number | null;
  readonly metrics?: Metrics;
  /** How often last-use times are written to the store, ms. */
  readonly lastUseFlushMs?: number;
  /** Told of every request this process sent again on another credential (the demo prints it). */
  readonly onRetry?: (retry: Retry) => void;
}

function serverOptions(config: Config): http.ServerOptions {
  return {
    IncomingMessage: GatewayRequest,
    // Slow-loris guard for headers; bodies are the idle timeout's business
    // (a 1 GB upload may take minutes but never stalls for long).
    headersTimeout: config.headersTimeoutMs,
    requestTimeout: 0,
    // Node checks headersTimeout only this often (30 s by default), so a
    // client trickling header bytes would outlive a short limit by that much.
    connectionsCheckingInterval: Math.max(100, Math.min(1_000, Math.floor(config.headersTimeoutMs / 4))),
    keepAliveTimeout: config.keepAliveTimeoutMs,
    maxHeaderSize: config.maxHeaderBytes,
    // The upstream gets its own Host; a missing one must not turn into Node's plain-text 400.
    requireHostHeader: false,
  };
}

export async function createGateway(config: Config, store: KeyStore, logger: Logger, options: GatewayOptions = {}): Promise<Gateway> {
  const metrics = options.metrics ?? new Metrics({ routes: config.routes.map((r) => r.name) });
  let draining = false;
  const board = new CredentialBoard();
  const { capacity, room, shares } = roomOf(config, board, metrics, options, store);
  let runtime = buildRuntime(config, board, room);
  const keys = new KeyHolder(store, logger, metrics, () => runtime.config.keysMaxStalenessMs);
  await keys.start();
  const lastUse = lastUseWriter(store, options, logger, metrics);
  const sweeper = sweeperOf(() => runtime.config, metrics);
  const { ledger, leases, spend, admit, statusSources, units, usageStore, settler, outages } = await startUsage(config, store, logger, metrics, {
    ...options,
    keyIds: () => (keys.loaded === null ? null : new Set(keys.loaded.records.map((r) => r.id))),
    keyOf: (id) => keys.loaded?.records.find((r) => r.id === id) ?? null,
    runTarget: (name, label) => runTargetOf(runtime, name, label),
  });
  const sharing = credentialsSeenAndShared(board, metrics, logger, () => runtime, store, options);
  if (outages !== null) shares?.watchWith(outages.watch('capacity_rebalance'));
  metrics.watchLedger(() => usageStore.damaged === undefined);
  const pages = usageStore instanceof MemoryUsageStore ? null : pageThread(pageSource(config, units));

  const pipeline = createPipeline({
    runtime: () => runtime,
    keys: () => keys.current(),
    draining: () => draining,
    ledgerDamaged: () => usageStore.damaged !== undefined,
    sweeper,
    metrics,
    lastUse,
    complete: createCompletion(logger, metrics, () => credentialParams(runtime), ledger),
    admit,
    ledger,
    credentials: board,
    room,
    keyStatus: (principal, now) => keyStatus(statusSources, principal, units, now),
  });

  const server = createServer(config, pipeline, logger);

  let closing: Promise<void> | null = null;
  const listenFd = options.listenFd ?? null;
  let served = false; // the public port was bound and announced: a gateway that never served stops without a drain to speak of

  const gateway: Gateway = {
    server,
    metrics,
    listen: () =>
      listen(server, config, listenFd, (address) => {
        served = true;
        announce(config, keys, store, listenFd, logger, address);
      }),
    shutdown: () => {
      draining = true;
      sharing.stop();
      closing ??= drain({ server, runtime: () => runtime, keys, ledger, leases, spend, settler, lastUse, sweeper, store, logger, served, shares });
      detach(
        closing.then(() => pages?.close()),
        neverRejects,
      );
      return closing;
    },
    reloadKeys: () => keys.reload(),
    reconfigure: (next: Config) => {
      const previous = runtime;
      sharing.reloaded();
      runtime = buildRuntime(next, board, room);
      capacity?.configure(next.routes, next);
      applyToServer(server, previous, next, sweeper, logger);
    },
    readiness: () => withCapacity(withCredentials(readinessOf(keys, draining, runtime.config, usageStore, outages), runtime.config, board), capacity),
    keyCount: () => keys.loaded?.size ?? 0,
    // In memory (no ledger file could be opened) the figures are this process's own, and few: built here.
    keyStatus: (principal) => Promise.resolve(keyStatus(statusSources, principal, units, Date.now())),
    usagePage: pages === null ? ownUsagePage(usageStore, keys, config, units) : (params) => pages.page(params),
  };
  return gateway;
}

/**
 * Room on the routes' accounts: a worker asks its primary; otherwise this
 * process holds the counts (`capacity`), with their metrics.
 */
function roomOf(
  config: Config,
  board: CredentialBoard,
  metrics: Metrics,
  options: GatewayOptions,
  store: KeyStore,
): { capacity: Capacity | null; room: Room; shares: FleetShares | null } {
  if (options.worker?.room !== undefined) return { capacity: null, room: options.worker.room, shares: null };
  const capacity = ownCapacity(config, board, metrics.registry);
  return { capacity, room: capacity, shares: store.database === undefined ? null : fleetShares(capacity, store.database, config) };
}

/** The counts of room on the routes' accounts, held by this process (one gateway, or the primary of workers), with their metrics. */
export function ownCapacity(config: Config, board: CredentialBoard, registry: Registry): Capacity {
  let capacity: Capacity | null = null;
  const hooks = capacityMetrics(registry, () => capacity);
  capacity = new Capacity(config, (route, label, now) => board.available(route, label, now), hooks);
  capacity.configure(config.routes, config);
  return capacity;
}

/** In a fleet: this process's leases on the accounts' capacity (capacity/fleet.ts), rebalanced from now on. */
export function fleetShares(capacity: Capacity, database: Database, config: Config): FleetShares {
  const shares = new FleetShares(capacity, new PgShareStore(database), `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`, config.leaseTtlMs);
  shares.start();
  return shares;
}

/** Routes with a capacity: where they stand (docs/credentials.md, "Seen"). */
export function withCapacity(r: Readiness, capacity: Pick<Capacity, 'routes' | 'view'> | null): Readiness {
  const states = capacity === null ? null : capacityStates(capacity);
  return states === null ? r : { ...r, capacity: states };
}

/** The one sweep of every in-flight exchange's timeouts (request/timers.ts), its runs timed. */
function sweeperOf(config: () => Config, metrics: Metrics): Sweeper {
  return new Sweeper(config, expire, (seconds) => metrics.task('timer_sweep', seconds));
}

/** Last-use times, kept in memory and written to the store every 10 s (or `lastUseFlushMs`). */
function lastUseWriter(store: KeyStore, options: GatewayOptions, logger: Logger, metrics: Metrics): LastUse {
  return new LastUse(
    store,
    options.lastUseFlushMs ?? 10_000,
    (err) => logger.warn({ err }, 'last-use times not written'),
    (seconds) => metrics.task('last_use_write', seconds),
  );
}

/** The HTTP or HTTPS server, its events handed to the pipeline. */
function createServer(config: Config, pipeline: Pipeline, logger: Logger): http.Server {
  const server: http.Server =
    config.tls === null
      ? http.createServer(serverOptions(config))
      : https.createServer({ ...serverOptions(config), cert: config.tls.cert, key: config.tls.key });
  // Beyond this many open connections Node closes new ones at once; the ones open are served.
  server.maxConnections = config.maxConnections;
  serveEvents(server, pipeline, logger, config.tls !== null);
  return server;
}

/** A scraper run is asked about where the configuration in force points its route, with the credential that started it. */
function runTargetOf(runtime: Runtime, name: string, label: number): RunTarget | null {
  const route = runtime.config.routes.find((r) => r.name === name);
  const credential = route?.credentials.find((c) => c.label === label);
  return route === undefined || credential === undefined
    ? null
    : { target: route.target, credential: credential.header, upstreamCa: runtime.config.upstreamCa };
}

/** Routes with several credentials: how many are available, and which have none (docs/credentials.md, "Seen"). */
function withCredentials(r: Readiness, config: Config, board: CredentialBoard): Readiness {
  const several = config.routes.filter((route) => route.credentials.length > 1);
  if (several.length === 0) return r;
  const now = Date.now();
  const credentials: Record<string, { available: number; total: number }> = {};
  for (const route of several) credentials[route.name] = { available: board.availableCount(route, now), total: route.credentials.length };
  const exhausted = several.filter((route) => credentials[route.name]?.available === 0).map((route) => route.name);
  return { ...r, credentials, ...(exhausted.length > 0 ? { credentialsExhausted: exhausted } : {}) };
}

/**
 * Credentials set aside, seen (metrics, the log) and shared (workers, a
 * fleet); `reloaded` brings back those refused with 401, here and from peers
 * that saw them before (credential-share.ts).
 */
function credentialsSeenAndShared(
  board: CredentialBoard,
  metrics: Metrics,
  logger: Logger,
  runtime: () => Runtime,
  store: KeyStore,
  options: GatewayOptions,
): { stop(): void; reloaded(): void } {
  let reloadedAt = Date.now();
  const since = (): number => reloadedAt;
  if (options.worker !== undefined) shareWithPrimary(board, since);
  const stop =
    store.database === undefined
      ? () => undefined
      : shareInFleet(board, store.database, since, (err) =>
          logger.warn({ err }, 'credentials set aside could not be shared through the database; applied here'),
        );
  metrics.watchCredentials((route) => {
    const r = runtime().config.routes.find((x) => x.name === route);
    return r === undefined || r.credentials.length === 0 ? null : { available: board.availableCount(r, Date.now()), total: r.credentials.length };
  });
  board.onAside((a, shared) => {
    if (shared) return;
    metrics.credentialSetAside(a.route, a.label, a.status);
    const fields = { route: a.route, credential: a.label, status: a.status, until: a.until === Infinity ? null : new Date(a.until).toISOString() };
    // A 401 means the account's secret is wrong or revoked: someone must act.
    if (a.status === 401) logger.error(fields, 'upstream refused a credential (401); set aside until the configuration is reloaded');
    else logger.warn(fields, 'upstream credential set aside');
  });
  board.onRetry((retry) => {
    metrics.credentialRetry(retry.route.index, retry.status);
    options.onRetry?.(retry);
  });
  return {
    stop,
    reloaded: () => {
      reloadedAt = Date.now();
      board.reloaded();
    },
  };
}

/** The query parameters that carry a credential on some route (never logged). */
function credentialParams(runtime: Runtime): ReadonlySet<string> {
  const names = new Set<string>();
  for (const r of runtime.table.values()) for (const n of r.dropQuery) names.add(n);
  return names;
}

/** Bind (or take systemd's socket); `onListening` runs once bound, before the promise resolves. */
function listen(server: http.Server, config: Config, listenFd: number | null, onListening: (address: AddressInfo) => void): Promise<AddressInfo> {
  return new Promise((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException): void => reject(listenFd === null ? bindError(err, 'KEYWARD_PORT', config.host, config.port) : err);
    server.once('error', onError);
    const done = (): void => {
      server.off('error', onError);
      const address = server.address() as AddressInfo;
      onListening(address);
      resolve(address);
    };
    if (listenFd !== null) server.listen({ fd: listenFd }, done);
    else server.listen(config.port, config.host, done);
  });
}

/** The start-up line, and a warning for each thing an operator would want to know at once. */
function announce(config: Config, keys: KeyHolder, store: KeyStore, listenFd: number | null, logger: Logger, address: AddressInfo): void {
  logger.info(
    {
      address: address.address,
      port: address.port,
      tls: config.tls !== null,
      socketActivated: listenFd !== null,
      routes: config.enabledRoutes,
      disabledRoutes: config.routes.filter((r) => r.credential === null).map((r) => r.name),
      nativeAuth: config.routes.filter((r) => r.native !== null).map((r) => r.name),
      keys: keys.loaded?.size ?? 0,
      keysLoadMs: keys.loadMs,
      keyStore: store.location,
    },
    'keyward listening',
  );
  const idle = idleReason(config, keys.loaded?.size ?? 0);
  if (idle !== null && keys.loaded !== null) logger.warn({ reason: idle }, 'nothing to serve yet; /readyz answers 503 until there is');
  // Typos in option names: a route switched off or a limit not set, said at once (an error with KEYWARD_STRICT_ENV=1).
  for (const u of config.unknownVariables) logger.warn({ variable: u.name, suggestion: u.suggestion }, unknownMessage(u));
  if (!config.egressFilter) logger.warn('egress filter off (KEYWARD_EGRESS_FILTER=off): an upstream that echoes its secret reaches the client');
  const { tooShort } = secretForms(config.routes);
  if (config.egressFilter && tooShort.length > 0) logger.warn({ secrets: tooShort }, 'secrets shorter than 8 characters are not filtered from responses');
}

/** What a drain stops, in order. */
interface DrainParts {
  readonly server: http.Server;
  readonly runtime: () => Runtime;
  readonly keys: KeyHolder;
  readonly ledger: Ledger;
  readonly leases: { stop(): Promise<unknown> } | null;
  /** In a fleet: the leases on the accounts' capacity, given back once the requests ended. */
  readonly shares: { stop(): Promise<unknown> } | null;
  readonly spend: { quiet(): Promise<void>; stop(): void } | null;
  readonly settler: { stop(): Promise<void> } | null;
  readonly lastUse: LastUse;
  readonly sweeper: Sweeper;
  readonly store: KeyStore;
  readonly logger: Logger;
  /** Whether the gateway ever served: one that never bound its port closes its stores without saying `draining` or `stopped`. */
  readonly served: boolean;
}

/** Readiness with the background tasks failing now, if any (null: this process runs none). */
export function withBackground(r: Readiness, outages: Pick<Outages, 'failing'> | null): Readiness {
  const failing = outages?.failing() ?? [];
  return failing.length === 0 ? r : { ...r, failing };
}

/** Readiness with the ledger's problem, if any: still ready (keys without a quota or budget are served), and saying why the others are refused. */
export function withLedger(r: Readiness, store: Pick<UsageStore, 'damaged' | 'location'>): Readiness {
  if (store.damaged === undefined) return r;
  const problem = `usage ledger ${store.location} cannot be read (${store.damaged}); keys with a quota or budget get 503 ledger_unavailable`;
  return { ...r, problem: r.problem === undefined ? problem : `${r.problem}; ${problem}` };
}

/** Stop accepting, let requests in flight finish up to the drain deadline, then close the stores; never longer (docs/operations.md, "Signals"). */
function drain({ server, runtime, keys, ledger, leases, shares, spend, settler, lastUse, sweeper, store, logger, served }: DrainParts): Promise<void> {
  return new Promise<void>((resolve) => {
    const { drainTimeoutMs } = runtime().config;
    const endBy = Date.now() + drainTimeoutMs;
    keys.stop();
    detach(ledger.leave(), neverRejects);
    if (served) logger.info({ drainTimeoutMs }, 'draining');
    // Connections become idle as their last response ends; close them as they do.
    const sweep = setInterval(() => server.closeIdleConnections(), 100);
    const deadline = setTimeout(() => {
      logger.warn('drain deadline reached; closing remaining connections');
      server.closeAllConnections();
    }, drainTimeoutMs);
    server.close(() => {
      clearInterval(sweep);
      clearTimeout(deadline);
      // Run-starts whose clients left are read to their end so that their
      // runs are recorded (docs/limits.md, "Scraper runs"): waited for up to
      // the drain deadline, their upstream timers still running.
      detach(untilNoneWatched(sweeper, endBy).then(afterRequests), neverRejects);
    });
    const afterRequests = (): void => {
      sweeper.stop();
      for (const f of runtime().forwarders.values()) f.close();
      // Requests may have taken the whole drain: the ledger still gets a moment to write or keep its counts.
      const left = Math.max(FINAL_WRITE_MS, endBy - Date.now());
      // Pending runs stay in the store: the next start (or another gateway) settles them.
      // Its questions end first, so that no claim outlives this gateway while the store still takes writes.
      // An alert delivery under way finishes and is marked first, or the next start would send it again.
      detach(
        within(spend?.quiet() ?? Promise.resolve(), Math.min(left, FINAL_WRITE_MS), undefined)
          .then(() => {
            // Leases give back what they did not use, so the others may admit it at once.
            spend?.stop();
            return within(settler?.stop() ?? Promise.resolve(), Math.min(left, FINAL_WRITE_MS), undefined);
          })
          .then(() =>
            Promise.all([
              within(lastUse.stop(), left, undefined),
              within(leases?.stop().catch(() => undefined) ?? Promise.resolve(), left, undefined),
              within(shares?.stop().catch(() => undefined) ?? Promise.resolve(), left, undefined),
              ledger.stop(left),
            ]),
          )
          .finally(async () => {
            await within(store.close?.().catch(() => undefined) ?? Promise.resolve(), FINAL_WRITE_MS, undefined);
            if (served) logger.info('stopped');
            resolve();
          }),
        (err) => logger.error({ err }, 'drain: a final write failed'),
      );
    };
    server.closeIdleConnections();
  });
}

/** The usage page built on this thread, from this process's own store and key set. */
function ownUsagePage(
  store: UsageStore,
  keys: KeyHolder,
  config: Config,
  units: (route: string) => string | null,
): (params: URLSearchParams) => Promise<string> {
  const routes = config.routes.map((r) => r.name);
  const runRoutes = config.routes.filter((r) => r.cost?.runs !== undefined).map((r) => r.name);
  return usagePage(store, () => keys.loaded?.records ?? [], routes, units, renderPage, runRoutes);
}

/** Resolves once no run-start is read on for a client that left, or at `endBy`. */
async function untilNoneWatched(sweeper: Sweeper, endBy: number): Promise<void> {
  while (sweeper.readingForRuns() && Date.now() < endBy) await new Promise((r) => setTimeout(r, 20));
}

/** A reload's effect on the server itself (the runtime is already swapped): timeouts, limits, the certificate, the log level. */
function applyToServer(server: http.Server, previous: Runtime, next: Config, sweeper: Sweeper, logger: Logger): void {
  const ignored = restartOnlyChanges(previous.config, next);
  if (ignored.length > 0) logger.warn({ options: ignored }, 'these options change only on restart; the rest of the new configuration applies');
  // Requests in flight keep the forwarder they started with; its sockets close as they finish.
  for (const f of previous.forwarders.values()) f.retire();
  server.headersTimeout = next.headersTimeoutMs;
  server.keepAliveTimeout = next.keepAliveTimeoutMs;
  server.maxConnections = next.maxConnections;
  if (next.tls !== null && server instanceof https.Server) server.setSecureContext({ cert: next.tls.cert, key: next.tls.key });
  logger.level = next.logLevel;
  sweeper.reschedule();
  logger.info({ routes: next.enabledRoutes, disabledRoutes: next.routes.filter((r) => r.credential === null).map((r) => r.name) }, 'configuration reloaded');
}

/** Ready when a key set serves and there is something to forward, with the ledger and the background tasks; otherwise why not. */
function readinessOf(keys: KeyHolder, draining: boolean, config: Config, usageStore: UsageStore, outages: Outages | null): Readiness {
  return withBackground(withLedger(keysReadiness(keys, draining, config), usageStore), outages);
}

function keysReadiness(keys: KeyHolder, draining: boolean, config: Config): Readiness {
  const set = keys.loaded;
  if (draining) return { ready: false, draining, keys: set?.size ?? null, reason: 'draining' };
  if (set === null) return { ready: false, draining, keys: null, reason: 'no key set loaded' };
  if (keys.current() === null)
    return { ready: false, draining, keys: set.size, stale: true, reason: 'key store unreachable for longer than KEYWARD_KEYS_MAX_STALENESS' };
  const stale = keys.up ? {} : { stale: true, ...(keys.problem === null ? {} : { problem: keys.problem }) };
  const unsupported = set.unsupported === 0 ? {} : { keysUnsupported: set.unsupported };
  // A keys file whose last change cannot be applied: the last good set serves, but a revocation in
  // that change may be among what is not in force, so a load balancer is told (docs/keys.md, "Versions").
  if (keys.problem !== null) return { ready: false, draining, keys: set.size, ...unsupported, ...stale, reason: 'keys file cannot be applied' };
  // Up, but nothing it could forward: a load balancer should not send traffic here yet.
  const idle = idleReason(config, set.size);
  if (idle !== null) return { ready: false, draining, keys: set.size, ...unsupported, ...stale, reason: idle };
  return { ready: true, draining, keys: set.size, ...unsupported, ...stale };
}
