// Configuration from the environment (docs/configuration.md), validated once: every
// problem is collected and reported together with the option's name, then the
// result is frozen. Pure apart from reading secret files through `readFile`.
import { parseRange } from '../lib/addresses.ts';
import { availableParallelism } from 'node:os';
import { join, resolve } from 'node:path';
import { ConfigError, Options, type Env, type ReadFile } from './options.ts';
import { secret, serverTls, upstreamCa } from './secrets.ts';
import { unknownVariables, type UnknownVariable } from './unknown.ts';
import { routes } from './upstreams.ts';
import { queueSettings } from './capacity.ts';
import { costRoutes, type Route, type UpstreamSpec } from '../request/routes.ts';
import type { StoreOptions } from '../keys/open.ts';
import { parseDuration } from '../lib/units.ts';

export { ConfigError, effectiveEnv, parseEnvFile, type Env, type ReadFile } from './options.ts';

export interface Config {
  readonly host: string;
  readonly port: number;
  readonly keysFile: string;
  readonly logLevel: string;
  /** Time to wait for the upstream's response headers, ms. */
  readonly upstreamTimeoutMs: number;
  /** Time to open a connection to the upstream (TCP + TLS), ms. */
  readonly connectTimeoutMs: number;
  /** Time a client has to send its request headers, ms. */
  readonly headersTimeoutMs: number;
  /** Idle time before a client keep-alive connection is closed, ms. */
  readonly keepAliveTimeoutMs: number;
  /** On SIGTERM, how long in-flight requests may run before connections are cut, ms. */
  readonly drainTimeoutMs: number;
  /** Largest request body forwarded, bytes. */
  readonly maxBodyBytes: number;
  /** No byte in either direction of an in-flight exchange for this long: 408, or the client connection is closed, ms. */
  readonly idleTimeoutMs: number;
  /** Largest request head (request line and headers), bytes; larger ones get 431. */
  readonly maxHeaderBytes: number;
  /** Largest upstream response head relayed, bytes; a larger one is a 502. */
  readonly upstreamMaxHeaderBytes: number;
  /** How long an idle pooled upstream connection is kept (shorter when the upstream's Keep-Alive says so), ms. */
  readonly upstreamIdleMs: number;
  /** How often the usage ledger is written, ms. */
  readonly usageFlushMs: number;
  /** Scan responses for upstream secrets and mask them (egress.ts); off only to measure its cost. */
  readonly egressFilter: boolean;
  /** Decoded bytes one compressed response may make the gateway scan. */
  readonly maxDecodedBytes: number;
  /** Several credentials on a route (docs/credentials.md): which available one a request gets. */
  readonly credentialOrder: 'spread' | 'first';
  /** A credential answered 429 without a usable Retry-After is set aside this long, ms. */
  readonly credentialCooldownMs: number;
  /** A credential answered 402 (its account out of credit) is set aside this long, ms. */
  readonly credentialPaymentCooldownMs: number;
  /** The longest a request waits for room on its route's accounts, ms, and the most that wait per route (docs/credentials.md, "Capacity"). */
  readonly queueWaitMs: number;
  readonly queueMax: number;
  /** Largest request body kept so a request refused on one credential can be sent again on another, bytes. */
  readonly replayMaxBodyBytes: number;
  /** Proxies whose X-Forwarded-For is believed for a key's allowlist (docs/keys.md, "Allowed addresses"): address ranges. */
  readonly trustedProxies: readonly string[];
  /** Decoded bytes per compressed byte received, past the first MiB. */
  readonly maxRatio: number;
  /** Open client connections; new ones beyond it are closed at once. */
  readonly maxConnections: number;
  /** Extra PEM CA bundle trusted for upstream TLS, besides the system's roots. */
  readonly upstreamCa: string | null;
  /** Certificate and key for HTTPS on the public port; null serves plain HTTP. */
  readonly tls: { readonly cert: string; readonly key: string } | null;
  /** The admin listener (health, readiness, metrics); null when `off`. */
  /** `tokenForUsage`: the usage page needs an admin token whatever the address; absent: only off loopback. */
  readonly admin: { readonly host: string; readonly port: number; readonly tokenForUsage?: true } | null;
  /** Gateway processes (node:cluster); 1 runs in-process. */
  readonly workers: number;
  /** `postgres://…`: keys in PostgreSQL (docs/fleet.md) instead of the keys file; null for the file. */
  readonly databaseUrl: string | null;
  /** With a shared store: how long a lease on a quota or budget outlives its last renewal (a gateway that died), ms. */
  readonly leaseTtlMs: number;
  /** The longest a limited key's request waits for the ledger's store when its admission needs it, then 503 `ledger_unavailable`, ms. */
  readonly admissionWaitMs: number;
  /** With a shared store: how long a query may go unanswered before the store counts as down and its connections are replaced, ms. */
  readonly databaseTimeoutMs: number;
  /** With a shared store: refuse (503) once it has been unreachable this long, ms; 0 serves the last good set forever. */
  readonly keysMaxStalenessMs: number;
  /** Where limit alerts are POSTed (docs/limits.md, "Alerts"); null: logs and metrics only. */
  readonly alertWebhook: string | null;
  /** The HMAC-SHA256 key of the webhook's `X-Keyward-Signature`; null: unsigned. */
  readonly alertWebhookSecret: string | null;
  /** How long after an alert fired its delivery is still retried, ms. */
  readonly alertWebhookRetryMs: number;
  readonly routes: readonly Route[];
  /** KEYWARD_* variables no option reads (typos), with the closest known name; an error with KEYWARD_STRICT_ENV=1. */
  readonly unknownVariables: readonly UnknownVariable[];
  /** Names of the routes whose credential is configured, for the start-up line. */
  readonly enabledRoutes: readonly string[];
  /** The routes whose upstream reports a cost: the ones a key's budget may name (routes.ts). */
  readonly costRoutes: readonly string[];
}

const LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

function freezeDeep<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value) && !(value instanceof URL)) {
    for (const v of Object.values(value)) freezeDeep(v);
    Object.freeze(value);
  }
  return value;
}

/** How an unknown variable is reported: `unknown variable KEYWARD_SCRAPER_KEY; did you mean KEYWARD_SCRAPER_TOKEN?` */
export function unknownMessage(u: UnknownVariable): string {
  return `unknown variable ${u.name}${u.suggestion === null ? '' : `; did you mean ${u.suggestion}?`}`;
}

/** KEYWARD_KEYS_FILE, else $STATE_DIRECTORY/keys.json (systemd StateDirectory=), else ./keys.json. */
export function keysFilePath(env: Env, cwd: string): string {
  const o = new Options(env);
  const stateDir = o.get('STATE_DIRECTORY')?.split(':')[0];
  return resolve(cwd, o.get('KEYWARD_KEYS_FILE') ?? (stateDir !== undefined && stateDir !== '' ? join(stateDir, 'keys.json') : 'keys.json'));
}

/**
 * Clear of the Prometheus server, Pushgateway and Alertmanager defaults
 * (9090, 9091, 9093, 9094), of 9092 (Kafka) and 9095 (gRPC of Loki, Mimir
 * and Tempo), and below the exporter range (9100-9999), so a gateway can run
 * beside a Prometheus stack on one host with no port set.
 */
const ADMIN_PORT_DEFAULT = 9097;

function adminConfig(o: Options): Config['admin'] {
  if (o.get('KEYWARD_ADMIN_PORT') === 'off') return null;
  const host = o.text('KEYWARD_ADMIN_HOST', '127.0.0.1');
  // `auto`: the usage page needs an admin token once the listener is not on loopback; `on`: always (a proxy on
  // this host that publishes a loopback listener). The API itself always needs one (docs/admin-api.md, "Safety").
  const require = o.text('KEYWARD_ADMIN_REQUIRE_TOKEN', 'auto');
  if (require !== 'auto' && require !== 'on') o.problem('KEYWARD_ADMIN_REQUIRE_TOKEN must be auto or on');
  return { host, port: o.port('KEYWARD_ADMIN_PORT', ADMIN_PORT_DEFAULT), ...(require === 'on' ? { tokenForUsage: true as const } : {}) };
}

function workers(o: Options): number {
  const text = o.get('KEYWARD_WORKERS');
  if (text === undefined) return 1;
  if (text === 'auto') return Math.max(1, availableParallelism());
  if (/^[1-9]\d{0,2}$/.test(text)) return Number(text);
  o.problem('KEYWARD_WORKERS must be a whole number from 1 to 999, or auto');
  return 1;
}

/** Decoded bytes per compressed byte a response may reach (past its first MiB). */
function decodeRatio(o: Options): number {
  const text = o.get('KEYWARD_EGRESS_MAX_RATIO');
  if (text === undefined) return 100;
  if (/^[1-9]\d{0,5}$/.test(text) && Number(text) >= 2) return Number(text);
  o.problem('KEYWARD_EGRESS_MAX_RATIO must be a whole number from 2 to 999999');
  return 100;
}

/**
 * What a request waits for the ledger's store at most. A worker waits for
 * its primary longer than that (limits/admissions.ts, `workerWaitMs`), so
 * it is bounded: past 10 s a client's request would hang on a store that
 * does not answer for longer than the clients' own timeouts commonly are.
 */
function admissionWait(o: Options): number {
  const ms = o.duration('KEYWARD_ADMISSION_WAIT', '250ms');
  if (ms <= 10_000) return ms;
  o.problem('KEYWARD_ADMISSION_WAIT must be a duration up to 10s (e.g. 250ms)');
  return 250;
}

function maxConnections(o: Options): number {
  const text = o.get('KEYWARD_MAX_CONNECTIONS');
  if (text === undefined) return 10_000;
  if (/^[1-9]\d{0,6}$/.test(text)) return Number(text);
  o.problem('KEYWARD_MAX_CONNECTIONS must be a whole number from 1 to 9999999');
  return 10_000;
}

/** KEYWARD_ALERT_WEBHOOK: an http(s) URL, or unset. */
function alertWebhook(o: Options): string | null {
  const text = o.get('KEYWARD_ALERT_WEBHOOK');
  if (text === undefined || text === '') return null;
  try {
    const url = new URL(text);
    // Node's fetch refuses a URL with credentials in it (WHATWG Fetch): every
    // delivery would fail for the whole retry time. Said now, never echoed.
    if ((url.protocol === 'http:' || url.protocol === 'https:') && (url.username !== '' || url.password !== '')) {
      o.problem(
        'KEYWARD_ALERT_WEBHOOK must not carry a login (user:password@host): HTTP clients refuse such URLs; put a token in its path or query, and sign deliveries with KEYWARD_ALERT_WEBHOOK_SECRET',
      );
      return null;
    }
    if (url.protocol === 'http:' || url.protocol === 'https:') return url.href;
  } catch {
    // Reported below.
  }
  o.problem('KEYWARD_ALERT_WEBHOOK must be an http:// or https:// URL');
  return null;
}

/** KEYWARD_KEYS_MAX_STALENESS: a duration, or 0 (also the default) for never. */
function staleness(o: Options): number {
  const text = o.get('KEYWARD_KEYS_MAX_STALENESS');
  if (text === undefined || text === '0') return 0;
  const ms = parseDuration(text);
  if (ms === null) o.problem('KEYWARD_KEYS_MAX_STALENESS must be a duration with a unit (e.g. 5m), or 0 for never');
  return ms ?? 0;
}

/**
 * The configuration in `env` (KEYWARD_CONFIG_FILE already laid over it:
 * effectiveEnv), checked and frozen; throws ConfigError with every problem.
 * `providers` is the provider table (routes.ts), passed in by the entry point.
 */
export function loadConfig(env: Env, readFile: ReadFile, cwd: string, providers: readonly UpstreamSpec[]): Config {
  const { o, config, routeList } = read(env, readFile, cwd, providers);
  // Names read with this environment, and with none: options read only in
  // some cases (the admin host when the port is not `off`) are names all the same.
  const known = new Set([...o.asked, ...baseline(providers), 'KEYWARD_KEYS_FILE']);
  const unknown = unknownVariables(env, known);
  if (env.KEYWARD_STRICT_ENV === '1') for (const u of unknown) o.problem(unknownMessage(u));
  if (o.problems.length > 0) throw new ConfigError(o.problems);
  return freezeDeep({
    ...config,
    routes: routeList,
    unknownVariables: unknown,
    enabledRoutes: routeList.filter((r) => r.credential !== null).map((r) => r.name),
    costRoutes: costRoutes(providers),
  });
}

/** KEYWARD_TRUSTED_PROXIES: address ranges, comma-separated; empty: no proxy is believed. */
function trustedProxies(o: Options): string[] {
  const list = (o.get('KEYWARD_TRUSTED_PROXIES') ?? '')
    .split(',')
    .map((r) => r.trim())
    .filter((r) => r !== '');
  for (const r of list)
    if (parseRange(r) === null) o.problem(`KEYWARD_TRUSTED_PROXIES: ${r} is not an address range (10.0.0.0/8, 2001:db8::/32, or one address)`);
  return list;
}

/**
 * Only what picks and opens the key store (`keys`, `usage`, `db migrate`):
 * the other options' problems are serve's business, not a reason for a
 * command that manages keys to refuse.
 */
export function storeConfig(
  env: Env,
  cwd: string,
  readFile: ReadFile,
  providers: readonly UpstreamSpec[],
): StoreOptions & { readonly databaseTimeoutMs: number } {
  const only: Record<string, string | undefined> = {};
  for (const [k, v] of Object.entries(env)) if (!k.startsWith('KEYWARD_') || k.startsWith('KEYWARD_DATABASE_') || k === 'KEYWARD_KEYS_FILE') only[k] = v;
  const { databaseUrl, databaseTimeoutMs, keysFile, costRoutes } = loadConfig(only, readFile, cwd, providers);
  return { databaseUrl, databaseTimeoutMs, keysFile, costRoutes };
}

/**
 * Credential 3 to 32 of a route (`KEYWARD_SPEECH_KEY_7`), and credential 1's
 * own capacity (`KEYWARD_SPEECH_CONCURRENCY_1`): named by credential 2's row
 * wherever options are listed.
 */
const LATER_CREDENTIAL = /_(?:[3-9]|[12]\d|3[0-2])(?:_FILE)?$|_(?:CONCURRENCY|RATE)_1$/;

/** Every KEYWARD_* name the configuration reads (of the numbered credentials, the `_2` forms stand for the rest). */
export function knownVariables(providers: readonly UpstreamSpec[]): string[] {
  return [...baseline(providers), 'KEYWARD_KEYS_FILE'].filter((n) => n.startsWith('KEYWARD_') && !LATER_CREDENTIAL.test(n));
}

const BASELINES = new WeakMap<readonly UpstreamSpec[], ReadonlySet<string>>();

/** The names the configuration reads from an empty environment. */
function baseline(providers: readonly UpstreamSpec[]): ReadonlySet<string> {
  let names = BASELINES.get(providers);
  if (names === undefined) {
    names = read({}, () => '', '/', providers).o.asked;
    BASELINES.set(providers, names);
  }
  return names;
}

function read(env: Env, readFile: ReadFile, cwd: string, providers: readonly UpstreamSpec[]): { o: Options; config: Config; routeList: Route[] } {
  const o = new Options(env);
  const logLevel = o.oneOf('KEYWARD_LOG_LEVEL', 'info', LEVELS);
  const databaseUrl = secret(o, 'KEYWARD_DATABASE_URL', readFile);
  if (databaseUrl !== null && !/^postgres(ql)?:\/\//.test(databaseUrl)) o.problem('KEYWARD_DATABASE_URL must be a postgres:// URL');
  const config: Config = {
    host: o.text('KEYWARD_HOST', '127.0.0.1'),
    port: o.port('KEYWARD_PORT', 8080),
    keysFile: keysFilePath(env, cwd),
    logLevel,
    upstreamTimeoutMs: o.duration('KEYWARD_UPSTREAM_TIMEOUT', '300s'),
    connectTimeoutMs: o.duration('KEYWARD_CONNECT_TIMEOUT', '10s'),
    headersTimeoutMs: o.duration('KEYWARD_HEADERS_TIMEOUT', '30s'),
    keepAliveTimeoutMs: o.duration('KEYWARD_KEEPALIVE_TIMEOUT', '5s'),
    drainTimeoutMs: o.duration('KEYWARD_DRAIN_TIMEOUT', '30s'),
    idleTimeoutMs: o.duration('KEYWARD_IDLE_TIMEOUT', '5m'),
    // Below the idle timeouts of common upstream load balancers (5 s and up),
    // so a pooled connection is dropped by us before the upstream closes it.
    upstreamIdleMs: o.duration('KEYWARD_UPSTREAM_IDLE', '4s'),
    usageFlushMs: o.duration('KEYWARD_USAGE_FLUSH', '2s'),
    maxBodyBytes: o.size('KEYWARD_MAX_BODY', '2GiB'),
    // Node's parser takes up to about 2 GiB; below 1 KiB no real client gets through.
    maxHeaderBytes: o.size('KEYWARD_MAX_HEADER_SIZE', '16KiB', { min: 1024, max: 1024 ** 3, hint: '1KiB to 1GiB (e.g. 16KiB)' }),
    // Upstreams send more than clients do (many Set-Cookie, long CSP or Link headers).
    upstreamMaxHeaderBytes: o.size('KEYWARD_UPSTREAM_MAX_HEADER_SIZE', '64KiB', { min: 1024, max: 1024 ** 3, hint: '1KiB to 1GiB (e.g. 64KiB)' }),
    egressFilter: o.oneOf('KEYWARD_EGRESS_FILTER', 'on', ['on', 'off']) === 'on',
    // What one compressed response may make the gateway decode (docs/security.md).
    maxDecodedBytes: o.size('KEYWARD_EGRESS_MAX_DECODED', '256MiB', { min: 1024 * 1024, max: 1024 ** 4, hint: '1MiB to 1TiB (e.g. 256MiB)' }),
    maxRatio: decodeRatio(o),
    credentialOrder: o.oneOf<'spread' | 'first'>('KEYWARD_CREDENTIAL_ORDER', 'spread', ['spread', 'first']),
    credentialCooldownMs: o.duration('KEYWARD_CREDENTIAL_COOLDOWN', '30s'),
    credentialPaymentCooldownMs: o.duration('KEYWARD_CREDENTIAL_PAYMENT_COOLDOWN', '1h'),
    trustedProxies: trustedProxies(o),
    ...queueSettings(o),
    replayMaxBodyBytes: o.size('KEYWARD_REPLAY_MAX_BODY', '1MiB', { min: 0, max: 1024 ** 3, hint: '0 to 1GiB (e.g. 1MiB)' }),
    maxConnections: maxConnections(o),
    upstreamCa: upstreamCa(o, readFile),
    tls: serverTls(o, readFile),
    admin: adminConfig(o),
    workers: workers(o),
    databaseUrl,
    databaseTimeoutMs: o.duration('KEYWARD_DATABASE_TIMEOUT', '5s'),
    leaseTtlMs: o.duration('KEYWARD_LEASE_TTL', '30s'),
    admissionWaitMs: admissionWait(o),
    keysMaxStalenessMs: staleness(o),
    alertWebhook: alertWebhook(o),
    alertWebhookSecret: secret(o, 'KEYWARD_ALERT_WEBHOOK_SECRET', readFile),
    alertWebhookRetryMs: o.duration('KEYWARD_ALERT_WEBHOOK_RETRY', '6h'),
    routes: [],
    unknownVariables: [],
    enabledRoutes: [],
    costRoutes: [],
  };
  return { o, config, routeList: [...routes(o, readFile, providers)] };
}
