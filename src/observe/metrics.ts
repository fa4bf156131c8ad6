// The only importer of prom-client (docs/operations.md). The request path updates
// plain numbers in preallocated typed arrays — an index computation and an
// increment, no label lookup, no allocation — and prom-client reads them
// only when /metrics is scraped, through metric objects whose `get()` builds
// the samples then. prom-client still provides the registry, the exposition
// format, the default process and Node.js series, and the sum over
// `KEYWARD_WORKERS` (its AggregatorRegistry, over the cluster IPC channel).
import { AggregatorRegistry, collectDefaultMetrics, Counter, Gauge, Histogram as PromHistogram, Registry } from 'prom-client';
import { Histogram, scraped, TASK_BUCKETS, type Sample, type ScrapedMetric } from './metrics-series.ts';

const METHODS = ['GET', 'POST', 'PATCH', 'DELETE', 'PUT', 'HEAD', 'OPTIONS', 'OTHER'] as const;
const METHOD_INDEX: Readonly<Record<string, number>> = Object.fromEntries(METHODS.map((m, i) => [m, i]));
/** `code` label: 0 stands for "no status sent" (the client left first). */
const STATUS_SLOTS = 600;
const AUTH_FAILURES = ['missing', 'malformed', 'unknown', 'revoked', 'expired'] as const;
export type AuthFailure = (typeof AUTH_FAILURES)[number];
const LIMIT_REASONS = ['scope', 'address', 'rate', 'concurrency', 'quota', 'budget'] as const;
export type LimitReason = (typeof LIMIT_REASONS)[number];
/**
 * Work the event loop does on its own schedule, between requests: while one
 * runs, no request moves, so each is a possible cause of the latency tail
 * (docs/operations.md; bench/README.md, "The tail"). Collections of the
 * heap are prom-client's `nodejs_gc_duration_seconds`.
 */
const LOOP_TASKS = ['log_write', 'ledger_write', 'timer_sweep', 'last_use_write'] as const;
export type LoopTask = (typeof LOOP_TASKS)[number];

/** What the key store reports at scrape time. */
export interface KeystoreView {
  keys(): { active: number; revoked: number; expired: number } | null;
  up(): boolean;
  /** Stored rows skipped because they fail the record check. */
  invalid(): number;
}

export class Metrics {
  readonly registry = new Registry();
  /** Route label values: the configured routes (a route's `index` is its place here), then `none` for requests refused before routing. */
  readonly routeNames: readonly string[];
  /** The slot of requests that matched no route. */
  readonly noRoute: number;
  readonly #requests: Float64Array;
  readonly #duration: Histogram;
  readonly #ttfb: Histogram;
  readonly #bytes: Float64Array;
  readonly #inFlight: Int32Array;
  readonly #auth = new Float64Array(AUTH_FAILURES.length);
  readonly #limited: Float64Array;
  readonly #tasks = new Histogram(LOOP_TASKS.length, TASK_BUCKETS);
  /** Upstream failures are rare: a map keyed by route index and reason is enough. */
  readonly #upstreamErrors = new Map<string, number>();
  readonly #masked = new Map<string, number>();
  #reloadErrors = 0;
  #usageFlushErrors = 0;
  #usageSetAside = 0;
  #lastReload = 0;
  #keystore: KeystoreView | null = null;
  #ledgerUp: () => boolean = () => true;
  /** A route's credentials now (docs/credentials.md): available of total, null when not configured. */
  #credentials: (route: string) => { available: number; total: number } | null = () => null;
  readonly #setAside = new Map<string, number>();
  readonly #retries = new Map<string, number>();
  #exhausted: Float64Array = new Float64Array(0);

  /** `routes`: the configured routes' names, in their order (config.routes): the counters are sized from them, once. */
  constructor(options: { defaults?: boolean; routes: readonly string[] }) {
    const ROUTE_NAMES = [...options.routes, 'none'];
    const NO_ROUTE = ROUTE_NAMES.length - 1;
    this.routeNames = ROUTE_NAMES;
    this.noRoute = NO_ROUTE;
    this.#requests = new Float64Array(ROUTE_NAMES.length * METHODS.length * STATUS_SLOTS);
    this.#duration = new Histogram(ROUTE_NAMES.length);
    this.#ttfb = new Histogram(ROUTE_NAMES.length);
    this.#bytes = new Float64Array(ROUTE_NAMES.length * 2);
    this.#inFlight = new Int32Array(ROUTE_NAMES.length);
    this.#limited = new Float64Array(ROUTE_NAMES.length * LIMIT_REASONS.length);
    this.#exhausted = new Float64Array(ROUTE_NAMES.length);
    // prom-client types registerMetric for its own classes; these are read the same way (get()).
    for (const m of [...this.#requestMetrics(), ...this.#stateMetrics(), ...this.#credentialMetrics()]) this.registry.registerMetric(m as never);
    if (options.defaults !== false) collectDefaultMetrics({ register: this.registry });
  }

  /** Per request: counts, durations, bytes and refusals, by route. */
  #requestMetrics(): ScrapedMetric[] {
    const ROUTE_NAMES = this.routeNames;
    const route = (s: number): Record<string, string> => ({ route: ROUTE_NAMES[s] as string });
    return [
      scraped('keyward_requests_total', 'Requests answered, by route, method and status code (0: none sent).', 'counter', () => {
        const out: Sample[] = [];
        for (let i = 0; i < this.#requests.length; i++) {
          const v = this.#requests[i] as number;
          if (v === 0) continue;
          const code = i % STATUS_SLOTS;
          const m = Math.floor(i / STATUS_SLOTS) % METHODS.length;
          const rt = Math.floor(i / (STATUS_SLOTS * METHODS.length));
          out.push({ labels: { route: ROUTE_NAMES[rt], method: METHODS[m], code: String(code) }, value: v });
        }
        return out;
      }),
      scraped('keyward_request_duration_seconds', 'Time from request to the end of the response.', 'histogram', () =>
        this.#duration.samples('keyward_request_duration_seconds', route),
      ),
      scraped('keyward_upstream_ttfb_seconds', 'Time from forwarding to the upstream response headers.', 'histogram', () =>
        this.#ttfb.samples('keyward_upstream_ttfb_seconds', route),
      ),
      scraped(
        'keyward_loop_task_seconds',
        'Event-loop time of each run of a periodic task (log write, ledger write, timer sweep, last-use write): no request moves meanwhile.',
        'histogram',
        () => this.#tasks.samples('keyward_loop_task_seconds', (i) => ({ task: LOOP_TASKS[i] as string })),
      ),
      scraped('keyward_upstream_errors_total', 'Upstream failures by route and reason (error code).', 'counter', () =>
        [...this.#upstreamErrors].map(([key, value]) => {
          const [rt, reason] = key.split('\0') as [string, string];
          return { labels: { route: rt, reason }, value };
        }),
      ),
      scraped(
        'keyward_egress_masked_total',
        'Responses in which an upstream secret was found and masked (or the response cut), by route and secret (route and form, never the value).',
        'counter',
        () =>
          [...this.#masked].map(([key, value]) => {
            const [rt, secret] = key.split('\0') as [string, string];
            return { labels: { route: rt, secret }, value };
          }),
      ),
      scraped('keyward_auth_failures_total', 'Requests refused with 401, by reason.', 'counter', () =>
        AUTH_FAILURES.map((reason, i) => ({ labels: { reason }, value: this.#auth[i] as number })),
      ),
      scraped('keyward_limited_total', "Requests refused by a key's scope or limits.", 'counter', () => {
        const out: Sample[] = [];
        for (let i = 0; i < this.#limited.length; i++) {
          const v = this.#limited[i] as number;
          if (v > 0)
            out.push({ labels: { route: ROUTE_NAMES[Math.floor(i / LIMIT_REASONS.length)], reason: LIMIT_REASONS[i % LIMIT_REASONS.length] }, value: v });
        }
        return out;
      }),
      scraped('keyward_bytes_total', 'Body bytes by route and direction (in: from clients, out: to clients).', 'counter', () => {
        const out: Sample[] = [];
        for (let s = 0; s < ROUTE_NAMES.length; s++) {
          out.push({ labels: { route: ROUTE_NAMES[s], direction: 'in' }, value: this.#bytes[s * 2] as number });
          out.push({ labels: { route: ROUTE_NAMES[s], direction: 'out' }, value: this.#bytes[s * 2 + 1] as number });
        }
        return out;
      }),
    ];
  }

  /** Several credentials per route (docs/credentials.md): where they stand, set asides, retries, refusals. */
  #credentialMetrics(): ScrapedMetric[] {
    const ROUTE_NAMES = this.routeNames;
    const NO_ROUTE = this.noRoute;
    return [
      scraped(
        'keyward_upstream_credentials',
        "A route's upstream credentials by state (available, set aside).",
        'gauge',
        () =>
          ROUTE_NAMES.slice(0, NO_ROUTE).flatMap((name) => {
            const c = this.#credentials(name);
            return c === null
              ? []
              : [
                  { labels: { route: name, state: 'available' }, value: c.available },
                  { labels: { route: name, state: 'set_aside' }, value: c.total - c.available },
                ];
          }),
        'max',
      ),
      scraped(
        'keyward_upstream_credential_set_aside_total',
        'Upstream credentials set aside after the upstream answered 401, 402 or 429 with them, by route, credential (its number) and status.',
        'counter',
        () =>
          [...this.#setAside].map(([key, value]) => {
            const [rt, credential, status] = key.split('\0') as [string, string, string];
            return { labels: { route: rt, credential, status }, value };
          }),
      ),
      scraped(
        'keyward_upstream_retries_total',
        'Requests sent again on another credential, by route and the status that refused the previous one.',
        'counter',
        () =>
          [...this.#retries].map(([key, value]) => {
            const [rt, status] = key.split('\0') as [string, string];
            return { labels: { route: rt, status }, value };
          }),
      ),
      scraped(
        'keyward_upstream_credentials_exhausted_total',
        'Requests answered 503 upstream_credentials_exhausted: every credential of the route set aside.',
        'counter',
        () =>
          ROUTE_NAMES.slice(0, NO_ROUTE).flatMap((name, s) =>
            this.#exhausted[s] === 0 ? [] : [{ labels: { route: name }, value: this.#exhausted[s] as number }],
          ),
      ),
    ];
  }

  /** The gateway's state: in flight, keys, the key store and the ledger. */
  #stateMetrics(): ScrapedMetric[] {
    const ROUTE_NAMES = this.routeNames;
    const NO_ROUTE = this.noRoute;
    return [
      scraped('keyward_requests_in_flight', 'Requests being forwarded now.', 'gauge', () =>
        ROUTE_NAMES.slice(0, NO_ROUTE).map((name, s) => ({ labels: { route: name }, value: this.#inFlight[s] as number })),
      ),
      scraped(
        'keyward_keys',
        'Keys in the loaded set, by state.',
        'gauge',
        () => {
          const k = this.#keystore?.keys() ?? null;
          return k === null ? [] : (['active', 'revoked', 'expired'] as const).map((state) => ({ labels: { state }, value: k[state] }));
        },
        'max',
      ),
      scraped(
        'keyward_keystore_up',
        '1 while the key store can be read.',
        'gauge',
        () => [{ labels: {}, value: this.#keystore?.up() === true ? 1 : 0 }],
        'min',
      ),
      scraped(
        'keyward_keystore_invalid_rows',
        'Stored keys skipped because they fail the record check (each logged once, by id).',
        'gauge',
        () => [{ labels: {}, value: this.#keystore?.invalid() ?? 0 }],
        'max',
      ),
      scraped('keyward_keystore_reload_errors_total', 'Key store reloads that failed (the last good set kept serving).', 'counter', () => [
        { labels: {}, value: this.#reloadErrors },
      ]),
      scraped('keyward_usage_flush_errors_total', 'Usage ledger writes that failed (their counts are kept and written by a later flush).', 'counter', () => [
        { labels: {}, value: this.#usageFlushErrors },
      ]),
      scraped(
        'keyward_usage_set_aside_total',
        "Batches of kept usage set aside, not written, because they break the ledger's rules (logged with why).",
        'counter',
        () => [{ labels: {}, value: this.#usageSetAside }],
      ),
      scraped(
        'keyward_ledger_up',
        '1 while the usage ledger can be read (0: keys with a quota or budget get 503 ledger_unavailable).',
        'gauge',
        () => [{ labels: {}, value: this.#ledgerUp() ? 1 : 0 }],
        'min',
      ),
      scraped(
        'keyward_keystore_last_reload_timestamp_seconds',
        'When a key set was last loaded.',
        'gauge',
        () => [{ labels: {}, value: this.#lastReload }],
        'min',
      ),
    ];
  }

  /** Whether the usage ledger can be read (`keyward_ledger_up`). */
  watchLedger(up: () => boolean): void {
    this.#ledgerUp = up;
  }

  /** Where each route's credentials stand (`keyward_upstream_credentials`). */
  watchCredentials(view: (route: string) => { available: number; total: number } | null): void {
    this.#credentials = view;
  }

  /** A credential set aside by this process (`keyward_upstream_credential_set_aside_total`). */
  credentialSetAside(route: string, label: number, status: number): void {
    const key = `${route}\0${label}\0${status}`;
    this.#setAside.set(key, (this.#setAside.get(key) ?? 0) + 1);
  }

  /** A request sent again on another credential after `status`. */
  credentialRetry(route: number, status: number): void {
    const key = `${this.routeNames[route]}\0${status}`;
    this.#retries.set(key, (this.#retries.get(key) ?? 0) + 1);
  }

  credentialsExhausted(route: number): void {
    this.#exhausted[route] = (this.#exhausted[route] as number) + 1;
  }

  watchKeystore(view: KeystoreView): void {
    this.#keystore = view;
  }

  keysLoaded(now: number): void {
    this.#lastReload = now / 1000;
  }

  /** One run of a periodic task took `seconds` of the event loop. */
  task(kind: LoopTask, seconds: number): void {
    this.#tasks.observe(LOOP_TASKS.indexOf(kind), seconds);
  }

  /** Kept usage set aside because it breaks the ledger's rules (spool.ts). */
  usageSetAside(batches: number): void {
    this.#usageSetAside += batches;
  }

  usageFlushFailed(): void {
    this.#usageFlushErrors++;
  }

  keysReloadFailed(): void {
    this.#reloadErrors++;
  }

  /** One completed request. `route` is a `routeNames` index; `ttfb` is negative when there was none. */
  request(route: number, method: string, status: number, seconds: number, ttfbSeconds: number, bytesIn: number, bytesOut: number): void {
    const m = METHOD_INDEX[method] ?? METHODS.length - 1;
    const i = (route * METHODS.length + m) * STATUS_SLOTS + (status > 0 && status < STATUS_SLOTS ? status : 0);
    this.#requests[i] = (this.#requests[i] as number) + 1;
    this.#duration.observe(route, seconds);
    if (ttfbSeconds >= 0) this.#ttfb.observe(route, ttfbSeconds);
    this.#bytes[route * 2] = (this.#bytes[route * 2] as number) + bytesIn;
    this.#bytes[route * 2 + 1] = (this.#bytes[route * 2 + 1] as number) + bytesOut;
  }

  upstreamError(route: number, reason: string): void {
    const key = `${this.routeNames[route]}\0${reason}`;
    this.#upstreamErrors.set(key, (this.#upstreamErrors.get(key) ?? 0) + 1);
  }

  /** A response from `route` held `secret` (`seo password`, …). */
  egressMasked(route: number, secret: string): void {
    const key = `${this.routeNames[route]}\0${secret}`;
    this.#masked.set(key, (this.#masked.get(key) ?? 0) + 1);
  }

  authFailure(reason: AuthFailure): void {
    const i = AUTH_FAILURES.indexOf(reason);
    this.#auth[i] = (this.#auth[i] as number) + 1;
  }

  limited(route: number, reason: LimitReason): void {
    const i = route * LIMIT_REASONS.length + LIMIT_REASONS.indexOf(reason);
    this.#limited[i] = (this.#limited[i] as number) + 1;
  }

  inFlight(route: number, delta: number): void {
    this.#inFlight[route] = (this.#inFlight[route] as number) + delta;
  }

  /** The exposition text of this process. */
  text(): Promise<string> {
    return this.registry.metrics();
  }

  get contentType(): string {
    return this.registry.contentType;
  }

  /** In a cluster worker: answer the primary's scrape requests with this registry. */
  serveToPrimary(): void {
    AggregatorRegistry.setRegistries([this.registry]);
    new AggregatorRegistry();
  }
}

/** In the cluster primary: the workers' metrics, summed (docs/operations.md). */
export function clusterMetrics(): { text(): Promise<string>; contentType: string } {
  const aggregator = new AggregatorRegistry();
  return { text: () => aggregator.clusterMetrics(), contentType: aggregator.contentType };
}

/**
 * With no admin listener there is nowhere to read metrics from: the request
 * path then skips recording altogether (the bench measures the difference).
 */
class Unrecorded extends Metrics {
  override request(): void {}
  override upstreamError(): void {}
  override authFailure(): void {}
  override limited(): void {}
  override inFlight(): void {}
}

export function createMetrics(record: boolean, routes: readonly string[]): Metrics {
  return record ? new Metrics({ routes }) : new Unrecorded({ routes, defaults: false });
}

export type { Registry };

/** An empty registry (the primary of workers keeps its own series in one). */
export const newRegistry = (): Registry => new Registry();

/** `keyward_limit_alerts_total`, in the registry of the process that fires alerts (alerts/spend.ts); no per-key labels. */
/**
 * Failures of the background tasks of the process that decides limits
 * (observe/outages.ts), in its registry: one process's, or the primary's
 * beside its workers' sum (a worker runs none of these tasks).
 */
export function backgroundFailures(registry: Registry): Counter<'task'> {
  return new Counter({
    name: 'keyward_background_failures_total',
    help: 'Failures of background tasks by task (lease renewals and claims, the run settler, alert checks, usage reads); each outage is also logged when it starts and ends',
    labelNames: ['task'],
    registers: [registry],
  });
}

export function alertCounters(registry: Registry, pending: () => number): { fired: Counter<'kind' | 'threshold'>; deferred: Counter } {
  new Gauge({
    name: 'keyward_limit_alert_checks_pending',
    help: 'Keys whose alert thresholds are still to be checked (0: nothing more fires until a request is counted)',
    registers: [registry],
    collect() {
      this.set(pending());
    },
  });
  return {
    fired: new Counter({
      name: 'keyward_limit_alerts_total',
      help: 'Limit alerts fired, by limit kind and threshold (percent)',
      labelNames: ['kind', 'threshold'],
      registers: [registry],
    }),
    deferred: new Counter({
      name: 'keyward_limit_alert_checks_deferred_total',
      help: "Alert checks that could not read a key's figures or record a firing (the ledger locked or unreachable) and are made again",
      registers: [registry],
    }),
  };
}

/** Where a route's capacity stands, read at scrape time (capacity/capacity.ts `view`). */
export interface CapacityView {
  routes(): readonly string[];
  view(route: string): { readonly inFlight: readonly number[]; readonly limit: ReadonlyArray<number | null>; readonly queued: number } | null;
}

/** Seconds a request may wait in a route's queue, as the histogram's buckets see them (KEYWARD_QUEUE_WAIT is at most 5 min). */
const QUEUE_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300];

/**
 * Capacity per credential (docs/credentials.md, "Capacity"), in the
 * registry of the process that holds the counts (one gateway's, or the
 * primary's for its workers): the gauges read at scrape time, and the hooks
 * the queue calls when a request got room after waiting or was answered busy.
 */
export function capacityMetrics(
  registry: Registry,
  capacity: () => CapacityView | null,
): { waited(route: string, ms: number): void; busy(route: string): void } {
  new Gauge({
    name: 'keyward_upstream_in_flight',
    help: 'Requests in flight on each credential of a route with a capacity, by route and credential (its number)',
    labelNames: ['route', 'credential'],
    registers: [registry],
    collect() {
      const c = capacity();
      for (const route of c?.routes() ?? []) c?.view(route)?.inFlight.forEach((n, i) => this.set({ route, credential: String(i + 1) }, n));
    },
  });
  new Gauge({
    name: 'keyward_upstream_queued',
    help: 'Requests waiting for room on a route with a capacity',
    labelNames: ['route'],
    registers: [registry],
    collect() {
      const c = capacity();
      for (const route of c?.routes() ?? []) this.set({ route }, c?.view(route)?.queued ?? 0);
    },
  });
  const wait = new PromHistogram({
    name: 'keyward_upstream_queue_wait_seconds',
    help: 'How long requests waited for room on a route with a capacity (those that waited)',
    labelNames: ['route'],
    buckets: QUEUE_BUCKETS,
    registers: [registry],
  });
  const busy = new Counter({
    name: 'keyward_upstream_busy_total',
    help: 'Requests answered 503 upstream_busy: no room within KEYWARD_QUEUE_WAIT, or the queue full',
    labelNames: ['route'],
    registers: [registry],
  });
  return { waited: (route, ms) => wait.observe({ route }, ms / 1000), busy: (route) => busy.inc({ route }) };
}

/** Scraper runs settled after the fact (docs/limits.md, "Scraper runs"): booked, questions that failed, runs given up. */
export function runCounters(registry: Registry): { settled: Counter; failed: Counter<'reason'>; gaveUp: Counter } {
  return {
    settled: new Counter({ name: 'keyward_runs_settled_total', help: 'Scraper runs whose cost was booked once they ended', registers: [registry] }),
    failed: new Counter({
      name: 'keyward_run_checks_failed_total',
      help: 'Questions about a pending scraper run that got no usable answer (asked again later), by reason',
      labelNames: ['reason'],
      registers: [registry],
    }),
    gaveUp: new Counter({
      name: 'keyward_runs_unsettled_total',
      help: 'Scraper runs given up at the give-up age: their reservation stays booked as their cost',
      registers: [registry],
    }),
  };
}
