// `keyward serve` (docs/operations.md): one gateway process, or the
// primary of several; signals drain and reload it.
import { startAdmin, type Admin } from '../process/admin.ts';
import { adminApi, type AdminApi } from '../admin/api.ts';
import { effectiveEnv, knownVariables, loadConfig, type Config } from '../config/load.ts';
import { openKeyStore } from '../keys/open.ts';
import { createLogger, type LogHandle } from '../observe/log.ts';
import { clusterMetrics, createMetrics, newRegistry, type Registry } from '../observe/metrics.ts';
import { createGateway, fleetShares, ownCapacity, withBackground, withCapacity, withLedger, type Gateway, type Readiness } from '../process/server.ts';
import type { Capacity } from '../capacity/capacity.ts';
import type { FleetShares } from '../capacity/fleet.ts';
import type { Database } from '../keys/store.ts';
import { CredentialBoard } from '../request/credentials.ts';
import type { Outages } from '../observe/outages.ts';
import type { UsageStore } from '../ledger/store.ts';
import { Ledger } from '../ledger/ledger.ts';
import { periodUse } from '../ledger/ledger.ts';
import { startDeciding } from '../process/usage-part.ts';
import { costUnits } from '../process/runtime.ts';
import { pageSource, pageThread, type PageThread } from '../views/page-thread.ts';
import { countOnly, openUsageStore } from '../ledger/open.ts';
import { policyFor, type Policy } from '../limits/policy.ts';
import { keyStatus, type StatusSources } from '../views/key-status.ts';
import type { Principal } from '../keys/keyset.ts';
import { runSettler } from '../process/run-settler.ts';
import { inheritedListenFd } from '../process/systemd.ts';
import { closest } from '../config/unknown.ts';
import type { UpstreamSpec } from '../request/routes.ts';
import { EXIT_FAILURE, EXIT_OK, helpTexts, line, parse, readText, UsageError, type Io } from './args.ts';
import { detach } from '../lib/detach.ts';
import { failureOf } from './failures.ts';
import { asError } from '../lib/error.ts';

/** The configuration as it stands now: environment, KEYWARD_CONFIG_FILE, secret files. */
function currentConfig(io: Io, providers: readonly UpstreamSpec[]): Config {
  return loadConfig(effectiveEnv(io.env, readText), readText, io.cwd, providers);
}

export async function serveCommand(args: string[], io: Io, providers: readonly UpstreamSpec[]): Promise<number> {
  checkServeArgs(args, providers);
  const config = currentConfig(io, providers);
  // A misspelt variable, said plainly before anything listens (a worker
  // leaves it to its primary): the JSON warning after "listening" was easy
  // to miss while the gateway ran on a default.
  if (io.env.NODE_UNIQUE_ID === undefined) {
    for (const u of config.unknownVariables)
      line(io.stderr, `keyward: ${u.name} is not a keyward setting and is ignored${u.suggestion === null ? '' : `; did you mean ${u.suggestion}?`}`);
  }
  const listenFd = inheritedListenFd(io.env, io.pid);
  let worker = false;
  if (config.workers > 1) {
    // Loaded only when asked for: a single-process gateway carries no cluster machinery.
    const { default: cluster } = await import('node:cluster');
    if (cluster.isPrimary) return servePrimary(config, listenFd, io, providers);
    worker = true;
  }
  const log = createLogger(config.logLevel);
  const started = await startServing(config, listenFd, worker, log, providers);
  if (typeof started === 'string') {
    line(io.stderr, `keyward: cannot start: ${started}`);
    return EXIT_FAILURE;
  }
  return serveUntilStopped(started.gateway, started.admin, log, io, providers);
}

/** `serve` takes no options: `serve --port 41001` is told which variable it meant. */
function checkServeArgs(args: string[], providers: readonly UpstreamSpec[]): void {
  try {
    parse(args, {}, helpTexts(providers).serve);
  } catch (err) {
    const flag = args
      .find((a) => a.startsWith('--') && a !== '--help')
      ?.slice(2)
      .split('=')[0];
    const usage = failureOf(err);
    if (usage?.code !== 'KEYWARD_ERR_USAGE' || flag === undefined) throw err;
    const name = `KEYWARD_${flag.toUpperCase().replace(/-/g, '_')}`;
    const known = closest(name, knownVariables(providers));
    throw new UsageError(
      `serve takes no options; it is configured by environment variables${known === null ? '' : ` (--${flag}: ${known}, e.g. ${known}=… keyward serve)`}`,
      usage.help,
    );
  }
}

/** The gateway listening (and the admin listener, if any), or why it cannot start (logged). */
async function startServing(
  config: Config,
  listenFd: number | null,
  worker: boolean,
  log: LogHandle,
  providers: readonly UpstreamSpec[],
): Promise<{ gateway: Gateway; admin: Admin | null } | string> {
  // Workers record for the primary's admin listener; a single process only when it has one.
  // Sized once from the configured routes: a reload keeps the same table (routes.ts), so the same counters.
  const metrics = createMetrics(
    config.admin !== null,
    config.routes.map((r) => r.name),
  );
  log.timed((seconds) => metrics.task('log_write', seconds));
  try {
    const store = openKeyStore(config);
    // A worker's limits are decided by its primary, for the whole machine.
    const w = worker ? await import('../process/workers.ts') : null;
    const gateway = await createGateway(config, store, log.logger, {
      listenFd,
      metrics,
      ...(w === null
        ? {}
        : {
            worker: {
              admit: w.primaryAdmit(config.admissionWaitMs),
              limitStatus: w.primaryStatus(config.admissionWaitMs),
              room: w.primaryRoom(config.queueWaitMs),
            },
          }),
    });
    if (w !== null) {
      await gateway.listen();
      metrics.serveToPrimary();
      w.answerReadiness(() => gateway.readiness());
      return { gateway, admin: null };
    }
    // Every port bound before anything says listening: the admin port first, then the public one
    // (its announcement is the line that says the gateway serves), then the admin's own line.
    const admin =
      config.admin === null
        ? null
        : await startAdmin(
            config.admin,
            {
              readiness: () => gateway.readiness(),
              metrics: () => metrics.text(),
              metricsContentType: metrics.contentType,
              usage: (p) => gateway.usagePage(p),
              api: adminApi({ store, keysFile: config.keysFile, providers, logger: log.logger, keyStatus: (r) => gateway.keyStatus(r) }),
            },
            log.logger,
            false,
          );
    try {
      await gateway.listen();
    } catch (err) {
      await admin?.close();
      throw err;
    }
    admin?.announce();
    return { gateway, admin };
  } catch (err) {
    // A failure the message explains (a port in use, a damaged keys file) is
    // logged as that message; anything else with its stack, to be reported.
    const failure = failureOf(err);
    const message = failure?.code === 'KEYWARD_ERR_KEYS_FILE' ? `keys file ${config.keysFile}: ${failure.message}` : asError(err).message;
    const explained = failure?.code === 'KEYWARD_ERR_KEYS_FILE' || failure?.code === 'KEYWARD_ERR_BIND';
    log.logger.fatal(explained ? { error: message } : { err }, 'cannot start');
    await log.flush();
    return message;
  }
}

/** Serving until SIGTERM or SIGINT (a drain), reloading on SIGHUP. */
function serveUntilStopped(running: Gateway, admin: Admin | null, log: LogHandle, io: Io, providers: readonly UpstreamSpec[]): Promise<number> {
  return new Promise((resolve) => {
    let stopping = false;
    const stop = (signal: string): void => {
      if (stopping) return;
      stopping = true;
      log.logger.info({ signal }, 'shutdown requested');
      detach(
        running
          .shutdown()
          .then(() => admin?.close())
          .then(() => log.flush())
          .then(() => resolve(EXIT_OK)),
        (err) => {
          log.logger.error({ err }, 'shutdown failed');
          resolve(EXIT_FAILURE);
        },
      );
    };
    // `on`, not `once`: under systemd's default KillMode a worker gets SIGTERM
    // twice (directly and from the primary), and a second, unhandled one
    // would end the drain. shutdown() is idempotent.
    io.signals.on('SIGTERM', () => stop('SIGTERM'));
    io.signals.on('SIGINT', () => stop('SIGINT'));
    // systemd's `ExecReload=kill -HUP $MAINPID`: configuration, secrets,
    // certificates and keys are read again. A configuration with problems is
    // not applied: the running one keeps serving and every problem is logged.
    io.signals.on('SIGHUP', () => {
      try {
        running.reconfigure(currentConfig(io, providers));
      } catch (err) {
        const failure = failureOf(err);
        if (failure?.code !== 'KEYWARD_ERR_CONFIG') throw err;
        log.logger.error({ problems: failure.problems }, 'configuration not reloaded; keeping the running one');
      }
      detach(running.reloadKeys(), (err) => log.logger.error({ err }, 'keys not reloaded; keeping the loaded set'));
    });
  });
}

/** The key view's figures as a worker's `GET /keyward/key` gives them: from the machine's limiter, which the primary holds. */
function primaryKeyStatus(
  spend: Awaited<ReturnType<typeof startDeciding>>['spend'],
  limiter: Awaited<ReturnType<typeof startDeciding>>['limiter'],
  ledger: Ledger,
  alone: boolean,
  units: ReturnType<typeof costUnits>,
): (record: Principal) => Promise<unknown> {
  const sources: StatusSources = {
    usage: (keyId, now) => spend.status.usage(keyId, now),
    limits: (principal, use, now) => {
      const policy = policyFor(principal);
      return policy === null ? [] : limiter.status(principal.id, policy, now, ledger.gateways, alone ? ledger : use);
    },
  };
  return (record) => Promise.resolve(keyStatus(sources, record, units, Date.now()));
}

/** Keys remembered by the primary for the alerts of settled runs (the latest asked about). */
const RECENT_KEYS = 10_000;

async function servePrimary(config: Config, listenFd: number | null, io: Io, providers: readonly UpstreamSpec[]): Promise<number> {
  const { decideForWorkers, runPrimary } = await import('../process/workers.ts');
  const log = createLogger(config.logLevel);
  // One limiter for the machine: the workers ask it for every request of a
  // key with limits (docs/limits.md). It counts what they report; the
  // workers write the ledger.
  const keys = openKeyStore(config);
  const usage = countOnly(openUsageStore(config, keys, log.logger));
  const ledger = new Ledger(usage, (err, first) => {
    if (first) log.logger.warn({ err }, 'usage totals not read; kept and retried');
  });
  await ledger.start(config.usageFlushMs);
  // The primary decides limits, so it fires their alerts and says where a key stands; its own metric is added to the workers'.
  const registry = newRegistry();
  const units = costUnits(config);
  const { leases, limiter, spend, outages } = await startDeciding(config, usage, ledger, log.logger, registry, units);
  // The keys the workers asked about lately (the primary holds no key set): a settled run's alerts need its key's name and policy.
  const recent = new Map<string, { key: { id: string; name: string }; policy: Policy }>();
  const settler = runSettler({
    config,
    store: usage,
    ledger,
    limiter,
    spend,
    logger: log.logger,
    registry,
    watch: outages.watch('run_settling'),
    // The primary does not reload its configuration: the routes as it started.
    target: (name, label) => {
      const credential = config.routes.find((route) => route.name === name)?.credentials.find((c) => c.label === label);
      const r = config.routes.find((route) => route.name === name);
      return r === undefined || credential === undefined ? null : { target: r.target, credential: credential.header, upstreamCa: config.upstreamCa };
    },
    keyOf: (id) => recent.get(id) ?? null,
  });
  decideForWorkers(
    limiter,
    () => ledger.gateways,
    (key, policy, route, cost) => {
      ledger.record(key.id, route, 200, 0, 0, cost);
      spend.counted(key, policy);
      recent.delete(key.id);
      recent.set(key.id, { key, policy });
      if (recent.size > RECENT_KEYS) recent.delete(recent.keys().next().value as string);
    },
    async (keyId, policy) => {
      const now = Date.now();
      const use = periodUse(await spend.status.usage(keyId, now));
      return limiter.status(keyId, policy, now, ledger.gateways, usage.fleet === undefined ? ledger : use);
    },
  );
  const { capacity, shares } = await machineCapacity(config, registry, io, providers, keys.database, outages);
  const primary = runPrimary(config.workers, ['serve'], io, listenFd === null ? {} : { KEYWARD_INHERITED_FD: String(listenFd) });
  const { admin, pages } = await primaryAdmin(
    config,
    primary,
    { ledger: usage, outages, capacity },
    registry,
    units,
    log,
    io,
    adminApi({
      store: keys,
      keysFile: config.keysFile,
      providers,
      logger: log.logger,
      keyStatus: primaryKeyStatus(spend, limiter, ledger, usage.fleet === undefined, units),
    }),
  );
  const code = await primary.done;
  await admin?.close();
  await pages?.close();
  spend.stop();
  await settler?.stop();
  await Promise.all([leases?.stop(), shares?.stop()].map(async (stopped) => (stopped ?? Promise.resolve()).catch(() => undefined)));
  await ledger.stop(1_000);
  await keys.close?.().catch(() => undefined);
  await log.flush();
  return code;
}

/**
 * The machine's room on the routes' accounts, held by the primary for its
 * workers (docs/credentials.md, "Capacity"); applied again on SIGHUP (a
 * configuration with problems is the workers' to log, and changes nothing).
 */
async function machineCapacity(
  config: Config,
  registry: Registry,
  io: Io,
  providers: readonly UpstreamSpec[],
  database: Database | undefined,
  outages: Outages,
): Promise<{ capacity: Capacity; shares: FleetShares | null }> {
  const { holdRoomForWorkers } = await import('../process/workers.ts');
  const board = new CredentialBoard();
  const capacity = ownCapacity(config, board, registry);
  holdRoomForWorkers(capacity, board);
  // In a fleet the primary holds the machine's leases.
  const shares = database === undefined ? null : fleetShares(capacity, database, config);
  shares?.watchWith(outages.watch('capacity_rebalance'));
  io.signals.on('SIGHUP', () => {
    board.reloaded();
    try {
      const next = currentConfig(io, providers);
      capacity.configure(next.routes, next);
    } catch {
      // Logged by every worker, which keeps its configuration too.
    }
  });
  return { capacity, shares };
}

/** The primary's admin listener, if configured: the workers' metrics summed with its own, the usage page in a thread. */
async function primaryAdmin(
  config: Config,
  primary: { readiness(): Promise<Readiness> },
  /** The primary's own ledger (it counts for the machine): a damaged one is named as a worker's is; and its background tasks. */
  own: { readonly ledger: Pick<UsageStore, 'damaged' | 'location'>; readonly outages: Outages; readonly capacity: Capacity },
  registry: Registry,
  units: (route: string) => string | null,
  log: LogHandle,
  io: Io,
  api: AdminApi,
): Promise<{ admin: Admin | null; pages: PageThread | null }> {
  if (config.admin === null) return { admin: null, pages: null };
  const summed = clusterMetrics();
  // The page in a thread of its own, which reads the key records from the store at most every 10 s (the primary holds no key set).
  const pages = pageThread(pageSource(config, units));
  try {
    const text = async (): Promise<string> => `${await summed.text()}\n${await registry.metrics()}`;
    const admin = await startAdmin(
      config.admin,
      {
        readiness: async () => withCapacity(withBackground(withLedger(await primary.readiness(), own.ledger), own.outages), own.capacity),
        metrics: text,
        metricsContentType: summed.contentType,
        usage: (p) => pages.page(p),
        api,
      },
      log.logger,
    );
    return { admin, pages };
  } catch (err) {
    line(io.stderr, `keyward: admin listener: ${asError(err).message}`);
    io.signals.emit('SIGTERM');
    return { admin: null, pages };
  }
}
