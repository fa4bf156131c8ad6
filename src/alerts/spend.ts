// Seeing spend (docs/limits.md, "A key's own status" and "Alerts"), put
// together for the process that decides a key's limits: one gateway, or the
// primary of workers. It answers where a key stands and fires the alerts;
// a worker asks its primary for the limits and reads usage itself.
import { alertCounters, type Registry } from '../observe/metrics.ts';
import type { Principal } from '../keys/keyset.ts';
import type { Logger } from '../observe/log.ts';
import { Alerts, type Alert } from './alerts.ts';
import { MemoryAlertStore } from '../ledger/memory-store.ts';
import { StoreView, type StatusSources } from '../views/key-status.ts';
import { periodUse } from '../ledger/ledger.ts';
import type { Ledger } from '../ledger/ledger.ts';
import type { FleetFigures, Limiter } from '../limits/limiter.ts';
import { policyFor, type Policy } from '../limits/policy.ts';
import { Webhook } from './webhook.ts';
import type { AlertStore, UsageStore } from '../ledger/store.ts';
import { Retrier } from '../lib/retry.ts';
import { detach, neverRejects } from '../lib/detach.ts';
import { UNWATCHED, type Outages, type Watch } from '../observe/outages.ts';

export interface SpendOptions {
  readonly config: {
    readonly alertWebhook: string | null;
    readonly alertWebhookSecret: string | null;
    readonly alertWebhookRetryMs: number;
    readonly usageFlushMs: number;
  };
  /** The ledger's store as this process opened it (reads rows; records alerts). */
  readonly store: UsageStore;
  readonly ledger: Ledger;
  readonly limiter: Limiter;
  /** In a fleet, the store's view of a key's figures (`storeView`), the limiter's too; null for one machine. */
  readonly view: StoreView | null;
  readonly logger: Logger;
  /** Where failing alert checks are seen (observe/outages.ts); absent: nowhere (a tool's). */
  readonly outages?: Outages | null;
  /** Where `keyward_limit_alerts_total` is registered. */
  readonly registry: Registry;
  /** A route's cost unit (`usd`, `characters`). */
  readonly unitOf: (route: string) => string;
}

export interface Spend {
  readonly status: StatusSources;
  /** A request of this key was counted: check its alert thresholds (soon, off the request path). */
  counted(key: { id: string; name: string }, policy: Policy): void;
  readonly alerts: Alerts;
  readonly webhook: Webhook | null;
  /** Alerts fired and not delivered before the last stop are sent (within the retry window). */
  start(): Promise<void>;
  /**
   * Resolves once no delivery is under way and every delivery made is
   * marked in the store: a drain waits for it (bounded), or the next start
   * would send a delivered alert again.
   */
  quiet(): Promise<void>;
  stop(): void;
}

/**
 * Counts come from memory when this process sees every request of the
 * machine (one gateway); in a fleet the others' counts are in the store, so
 * a key's usage is the store's rows (read at most once per flush interval)
 * plus what this gateway has not written yet.
 */
export function createSpend(o: SpendOptions): Spend {
  const fleet = o.store.fleet !== undefined;
  const view = o.view;
  // Alerts wait for the store's figures (never a stale answer): a threshold is judged on the fleet's totals.
  const fresh = fleet ? new StoreView(o.store, o.ledger, 0, Infinity) : null;
  const alertStore: AlertStore = o.store.alerts ?? new MemoryAlertStore();
  // A store that fails (a SQLite ledger another process is writing, a database not reachable yet) is asked again.
  const retrier = new Retrier();
  // A firing marked delivered, asked again if the store fails: else the next start would send it twice.
  const marking = new Set<Promise<unknown>>();
  const webhook = webhookFor(o, (id) => {
    const marked = retrier.run(() => alertStore.alertDelivered(id), 500, 6).finally(() => marking.delete(marked));
    marking.add(marked);
    detach(marked, neverRejects);
  });
  // Read at scrape time, once the alerts below exist.
  const counters = alertCounters(o.registry, () => alerts.pending);
  const alerts = new Alerts({
    store: alertStore,
    use: fresh === null ? () => o.ledger : async (keyId, now) => periodUse(await fresh.usage(keyId, now)),
    fire: firing(o, counters.fired, webhook),
    onDeferred: () => counters.deferred.inc(),
    watch: o.outages?.watch('alert_check') ?? UNWATCHED,
    unitOf: o.unitOf,
    // A fleet's totals are read from the store: once per flush interval, not after each request.
    everyMs: fleet ? o.config.usageFlushMs : 0,
  });
  return {
    status: statusSources(o, view),
    counted: (key, policy) => alerts.touched(key, policy),
    alerts,
    webhook,
    start: async () => {
      if (webhook === null) return;
      await retrier.run(() => resend(o, alertStore, webhook), 1_000, Infinity);
    },
    quiet: async () => {
      await webhook?.idle();
      await Promise.allSettled([...marking]);
    },
    stop: () => {
      retrier.stop();
      alerts.stop();
      webhook?.stop();
    },
  };
}

/** The alert webhook, if one is configured. */
function webhookFor(o: SpendOptions, delivered: (id: string) => void): Webhook | null {
  if (o.config.alertWebhook === null) return null;
  return new Webhook({
    url: o.config.alertWebhook,
    secret: o.config.alertWebhookSecret,
    retryMs: o.config.alertWebhookRetryMs,
    onDelivered: delivered,
    onFailed: (id, reason, attempt, gaveUp) =>
      o.logger[gaveUp ? 'error' : 'warn'](
        { alert: id, reason, attempt },
        gaveUp ? 'alert webhook: not delivered within KEYWARD_ALERT_WEBHOOK_RETRY; given up' : 'alert webhook: not delivered; retrying',
      ),
  });
}

/** An alert fires: a log line, the counter, and the webhook. */
function firing(o: SpendOptions, metric: ReturnType<typeof alertCounters>['fired'], webhook: Webhook | null): (alert: Alert, body: string) => void {
  return (alert, body) => {
    const l = alert.limit;
    o.logger.warn(
      {
        alert: alert.id,
        event: alert.event,
        keyId: alert.key.id,
        keyName: alert.key.name,
        limit: l.kind,
        route: l.route ?? null,
        threshold: l.threshold,
        used: alert.used,
        value: l.value,
        unit: l.unit,
        period: l.periodKey,
      },
      `limit alert: key ${alert.key.name} has used ${l.threshold}% of its ${l.kind === 'quota' ? 'quota' : `${l.route} budget`} this ${l.period}`,
    );
    metric.inc({ kind: l.kind, threshold: String(l.threshold) });
    webhook?.send(alert.id, body, Date.parse(alert.at));
  };
}

/**
 * In a fleet, a key's usage is the store's rows (read at most once per flush
 * interval) plus what this gateway has not written yet; null for one machine.
 */
export function storeView(store: UsageStore, ledger: Ledger, flushMs: number, watch: Watch = UNWATCHED): StoreView | null {
  return store.fleet === undefined ? null : new StoreView(store, ledger, flushMs, 1_000, watch);
}

/** In a fleet, the limiter reads the fleet's figures from the store's view. */
export function fleetFigures(view: StoreView): FleetFigures {
  return {
    // A refusal the fleet's leases decided gives the key's fleet figures as /keyward/key last read them.
    cached: (keyId, now) => {
      const u = view.cached(keyId, now);
      return u === null ? null : periodUse(u);
    },
    // A scraper run's cap is what is left of the fleet's budget: read for it (docs/limits.md, "Scraper runs").
    fresh: (keyId, now) => view.refresh(keyId, now),
  };
}

/** Where a key stands: its usage (this process's ledger, or the fleet's store) and its limits. */
function statusSources(o: SpendOptions, view: StoreView | null): StatusSources {
  return {
    usage: (keyId, now) => (view === null ? o.ledger.usage(keyId, now) : view.usage(keyId, now)),
    limits: (principal: Principal, use, now) => {
      const policy = policyFor(principal);
      return policy === null ? [] : o.limiter.status(principal.id, policy, now, o.ledger.gateways, view === null ? o.ledger : use);
    },
  };
}

/** Alerts fired and not delivered before the last stop, within the retry window, sent again. */
async function resend(o: SpendOptions, alertStore: AlertStore, webhook: Webhook): Promise<void> {
  const found = await alertStore.undeliveredAlerts(o.ledger.id, Date.now() - o.config.alertWebhookRetryMs, 60_000);
  for (const a of found) webhook.send(a.id, a.body, a.at);
  if (found.length > 0) o.logger.info({ alerts: found.length }, 'alerts not delivered before the last stop; sending them');
}
