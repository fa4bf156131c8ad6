// Configuration from the environment (design §4), validated once: every
// problem is collected and reported together with the option's name, then the
// result is frozen. Pure apart from reading secret files through `readFile`.
import { availableParallelism } from 'node:os';
import { join, resolve } from 'node:path';
import { createSecureContext } from 'node:tls';
import { METHOD_OVERRIDE_HEADERS, requestStripSet } from './headers.ts';
import { UPSTREAMS, type Route, type UpstreamSpec } from './routes.ts';
import { parseDuration, parseSize } from './units.ts';

export type Env = Readonly<Record<string, string | undefined>>;

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
  /** Scan responses for upstream secrets and mask them (egress.ts); off only to measure its cost. */
  readonly egressFilter: boolean;
  /** Open client connections; new ones beyond it are closed at once. */
  readonly maxConnections: number;
  /** Extra PEM CA bundle trusted for upstream TLS, besides the system's roots. */
  readonly upstreamCa: string | null;
  /** Certificate and key for HTTPS on the public port; null serves plain HTTP. */
  readonly tls: { readonly cert: string; readonly key: string } | null;
  /** The admin listener (health, readiness, metrics); null when `off`. */
  readonly admin: { readonly host: string; readonly port: number } | null;
  /** Gateway processes (node:cluster); 1 runs in-process. */
  readonly workers: number;
  /** `postgres://…`: keys in PostgreSQL (design §9) instead of the keys file; null for the file. */
  readonly databaseUrl: string | null;
  /** With a shared store: refuse (503) once it has been unreachable this long, ms; 0 serves the last good set forever. */
  readonly keysMaxStalenessMs: number;
  readonly routes: readonly Route[];
  /** Names of the routes whose credential is configured, for the start-up line. */
  readonly enabledRoutes: readonly string[];
}

export class ConfigError extends Error {
  override name = 'ConfigError';
  readonly problems: readonly string[];
  constructor(problems: readonly string[]) {
    super(problems.join('; '));
    this.problems = problems;
  }
}

/** Options with a unit, their defaults, and the field they fill. */
const TIMED = [
  ['KEYWARD_UPSTREAM_TIMEOUT', '300s', 'upstreamTimeoutMs'],
  ['KEYWARD_CONNECT_TIMEOUT', '10s', 'connectTimeoutMs'],
  ['KEYWARD_HEADERS_TIMEOUT', '30s', 'headersTimeoutMs'],
  ['KEYWARD_KEEPALIVE_TIMEOUT', '5s', 'keepAliveTimeoutMs'],
  ['KEYWARD_DRAIN_TIMEOUT', '30s', 'drainTimeoutMs'],
  ['KEYWARD_IDLE_TIMEOUT', '5m', 'idleTimeoutMs'],
  // Below the idle timeouts of common upstream load balancers (5 s and up),
  // so a pooled connection is dropped by us before the upstream closes it.
  ['KEYWARD_UPSTREAM_IDLE', '4s', 'upstreamIdleMs'],
] as const;
const MAX_BODY_DEFAULT = '2GiB';
const MAX_HEADER_DEFAULT = '16KiB';
// Upstreams send more than clients do (many Set-Cookie, long CSP or Link headers).
const UPSTREAM_MAX_HEADER_DEFAULT = '64KiB';
const LEVELS = new Set(['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent']);

export type ReadFile = (path: string) => string;

function freezeDeep<T>(value: T): T {
  if (typeof value === 'object' && value !== null && !Object.isFrozen(value) && !(value instanceof URL)) {
    for (const v of Object.values(value)) freezeDeep(v);
    Object.freeze(value);
  }
  return value;
}

/**
 * A secret from NAME, NAME_FILE, or systemd's LoadCredential=
 * ($CREDENTIALS_DIRECTORY/<name in lower case>), in that order. One trailing
 * newline is dropped (files written by `echo`).
 */
function secret(env: Env, name: string, readFile: ReadFile, problems: string[]): string | null {
  const direct = env[name];
  const file = env[`${name}_FILE`];
  if (direct !== undefined && direct !== '' && file !== undefined && file !== '') {
    problems.push(`${name} and ${name}_FILE are both set; set only one`);
    return null;
  }
  let value: string | null = null;
  if (direct !== undefined && direct !== '') value = direct;
  else if (file !== undefined && file !== '') {
    try {
      value = readFile(file);
    } catch (err) {
      problems.push(`${name}_FILE: cannot read the file (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
      return null;
    }
  } else if (env.CREDENTIALS_DIRECTORY !== undefined && env.CREDENTIALS_DIRECTORY !== '') {
    try {
      value = readFile(join(env.CREDENTIALS_DIRECTORY, name.toLowerCase()));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT') {
        problems.push(`${name}: cannot read the systemd credential (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
      }
      return null;
    }
  }
  if (value === null) return null;
  value = value.replace(/\r?\n$/, '');
  if (value === '') return null;
  // A secret lands in a header; a control character would make every request fail.
  // eslint-disable-next-line no-control-regex
  if (/[\x00-\x1f\x7f]/.test(value)) {
    problems.push(`${name} contains a control character or line break`);
    return null;
  }
  return value;
}

function upstreamUrl(env: Env, spec: UpstreamSpec, problems: string[]): { target: URL; basePath: string } | null {
  const text = env[spec.urlEnv] !== undefined && env[spec.urlEnv] !== '' ? (env[spec.urlEnv] as string) : spec.defaultUrl;
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    problems.push(`${spec.urlEnv} is not a URL`);
    return null;
  }
  const wrong =
    url.protocol !== 'http:' && url.protocol !== 'https:'
      ? 'must be http:// or https://'
      : url.username !== '' || url.password !== ''
        ? 'must not carry credentials (use the secret options)'
        : url.search !== '' || url.hash !== ''
          ? 'must not have a query or fragment'
          : null;
  if (wrong !== null) {
    problems.push(`${spec.urlEnv} ${wrong}`);
    return null;
  }
  return { target: new URL(url.origin), basePath: url.pathname.replace(/\/+$/, '') };
}

function route(env: Env, spec: UpstreamSpec, readFile: ReadFile, native: ReadonlySet<string>, problems: string[]): Route | null {
  const where = upstreamUrl(env, spec, problems);
  const secrets = spec.secretEnvs.map((n) => secret(env, n, readFile, problems));
  const present = secrets.filter((s) => s !== null).length;
  if (present > 0 && present < secrets.length) {
    const missing = spec.secretEnvs.filter((_, i) => secrets[i] === null);
    problems.push(`${missing.join(', ')} must be set along with ${spec.secretEnvs.filter((_, i) => secrets[i] !== null).join(', ')}`);
  }
  if (where === null) return null;
  const credential = present === secrets.length ? spec.credential(secrets as string[]) : null;
  return {
    name: spec.name,
    index: UPSTREAMS.indexOf(spec),
    prefix: `/${spec.name}/`,
    methods: new Set(spec.methods),
    target: where.target,
    basePath: where.basePath,
    credential,
    secretForms: credential === null ? [] : spec.secretForms(secrets as string[]),
    native: native.has(spec.name) ? spec.native : null,
    dropQuery: new Set(spec.dropQuery.map((q) => q.toLowerCase())),
    overrideQuery: new Set(spec.overrideQuery.map((q) => q.toLowerCase())),
    stripHeaders: requestStripSet([...spec.stripHeaders, ...METHOD_OVERRIDE_HEADERS], credential === null ? null : credential[0]),
  };
}

/** KEYWARD_KEYS_FILE, else $STATE_DIRECTORY/keys.json (systemd StateDirectory=), else ./keys.json. */
export function keysFilePath(env: Env, cwd: string): string {
  const stateDir = env.STATE_DIRECTORY?.split(':')[0];
  const chosen =
    env.KEYWARD_KEYS_FILE !== undefined && env.KEYWARD_KEYS_FILE !== ''
      ? env.KEYWARD_KEYS_FILE
      : stateDir !== undefined && stateDir !== ''
        ? join(stateDir, 'keys.json')
        : 'keys.json';
  return resolve(cwd, chosen);
}

/** Text of an optional file option (`KEYWARD_UPSTREAM_CA_FILE`, …), or null when unset. */
function optionalFile(env: Env, name: string, readFile: ReadFile, problems: string[]): string | null {
  const path = env[name];
  if (path === undefined || path === '') return null;
  try {
    return readFile(path);
  } catch (err) {
    problems.push(`${name}: cannot read the file (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
    return null;
  }
}

/** Checks PEM material the way the TLS stack will use it, so a bad file fails at start (or reload), not on the first request. */
function checkTls(options: { ca?: string; cert?: string; key?: string }, what: string, problems: string[]): boolean {
  try {
    createSecureContext(options);
    return true;
  } catch (err) {
    problems.push(`${what}: ${(err as Error).message.split('\n')[0]}`);
    return false;
  }
}

function tlsConfig(env: Env, readFile: ReadFile, problems: string[]): Config['tls'] {
  const cert = optionalFile(env, 'KEYWARD_TLS_CERT_FILE', readFile, problems);
  const key = optionalFile(env, 'KEYWARD_TLS_KEY_FILE', readFile, problems);
  const certSet = (env.KEYWARD_TLS_CERT_FILE ?? '') !== '';
  const keySet = (env.KEYWARD_TLS_KEY_FILE ?? '') !== '';
  if (certSet !== keySet) {
    problems.push('KEYWARD_TLS_CERT_FILE and KEYWARD_TLS_KEY_FILE must be set together');
    return null;
  }
  if (cert === null || key === null) return null;
  return checkTls({ cert, key }, 'KEYWARD_TLS_CERT_FILE/KEYWARD_TLS_KEY_FILE', problems) ? { cert, key } : null;
}

function port(text: string | undefined, name: string, fallback: number, problems: string[]): number {
  if (text === undefined || text === '') return fallback;
  const n = Number(text);
  if (!/^\d+$/.test(text) || n > 65535) {
    problems.push(`${name} must be an integer from 0 to 65535`);
    return fallback;
  }
  return n;
}

/**
 * Clear of the Prometheus server, Pushgateway and Alertmanager defaults
 * (9090, 9091, 9093, 9094), of 9092 (Kafka) and 9095 (gRPC of Loki, Mimir
 * and Tempo), and below the exporter range (9100-9999), so a gateway can run
 * beside a Prometheus stack on one host with no port set.
 */
export const ADMIN_PORT_DEFAULT = 9097;

function adminConfig(env: Env, problems: string[]): Config['admin'] {
  if (env.KEYWARD_ADMIN_PORT === 'off') return null;
  const host = env.KEYWARD_ADMIN_HOST !== undefined && env.KEYWARD_ADMIN_HOST !== '' ? env.KEYWARD_ADMIN_HOST : '127.0.0.1';
  return { host, port: port(env.KEYWARD_ADMIN_PORT, 'KEYWARD_ADMIN_PORT', ADMIN_PORT_DEFAULT, problems) };
}

function nativeRoutes(env: Env, problems: string[]): ReadonlySet<string> {
  const names = (env.KEYWARD_NATIVE_AUTH ?? '')
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n !== '');
  const known = new Set(UPSTREAMS.map((u) => u.name));
  for (const n of names) if (!known.has(n)) problems.push(`KEYWARD_NATIVE_AUTH: unknown route ${n} (routes: ${[...known].join(', ')})`);
  return new Set(names);
}

/**
 * `KEYWARD_CONFIG_FILE`: optional `NAME=value` lines (systemd EnvironmentFile
 * syntax without quoting rules beyond a matching pair of quotes). Values there
 * override the process environment, and the file is read again on SIGHUP, so
 * a running gateway can change any option it can apply without a restart.
 */
export function parseEnvFile(text: string): { values: Record<string, string>; problems: string[] } {
  const values: Record<string, string> = {};
  const problems: string[] = [];
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const line = (lines[i] as string).trim();
    if (line === '' || line.startsWith('#') || line.startsWith(';')) continue;
    const m = /^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$/.exec(line);
    if (m === null) {
      problems.push(`KEYWARD_CONFIG_FILE line ${i + 1}: expected NAME=value`);
      continue;
    }
    let value = m[2] as string;
    if (value.length >= 2 && (value[0] === '"' || value[0] === "'") && value.at(-1) === value[0]) value = value.slice(1, -1);
    values[m[1] as string] = value;
  }
  return { values, problems };
}

/** The environment with KEYWARD_CONFIG_FILE's values laid over it. */
export function effectiveEnv(env: Env, readFile: ReadFile): Env {
  const path = env.KEYWARD_CONFIG_FILE;
  if (path === undefined || path === '') return env;
  let text: string;
  try {
    text = readFile(path);
  } catch (err) {
    throw new ConfigError([`KEYWARD_CONFIG_FILE: cannot read the file (${(err as NodeJS.ErrnoException).code ?? 'error'})`]);
  }
  const { values, problems } = parseEnvFile(text);
  if (problems.length > 0) throw new ConfigError(problems);
  return { ...env, ...values };
}

export function loadConfig(env: Env, readFile: ReadFile, cwd: string): Config {
  const problems: string[] = [];

  const host = env.KEYWARD_HOST !== undefined && env.KEYWARD_HOST !== '' ? env.KEYWARD_HOST : '127.0.0.1';
  const listenPort = port(env.KEYWARD_PORT, 'KEYWARD_PORT', 8080, problems);

  const logLevel = env.KEYWARD_LOG_LEVEL !== undefined && env.KEYWARD_LOG_LEVEL !== '' ? env.KEYWARD_LOG_LEVEL : 'info';
  if (!LEVELS.has(logLevel)) problems.push(`KEYWARD_LOG_LEVEL must be one of ${[...LEVELS].join(', ')}`);

  const times: Record<string, number> = {};
  for (const [name, fallback, field] of TIMED) {
    const text = env[name] !== undefined && env[name] !== '' ? (env[name] as string) : fallback;
    const ms = parseDuration(text);
    if (ms === null || ms <= 0) problems.push(`${name} must be a positive duration with a unit (e.g. 500ms, 30s, 5m)`);
    times[field] = ms ?? 0;
  }

  const maxBodyText = env.KEYWARD_MAX_BODY !== undefined && env.KEYWARD_MAX_BODY !== '' ? env.KEYWARD_MAX_BODY : MAX_BODY_DEFAULT;
  const maxBodyBytes = parseSize(maxBodyText);
  if (maxBodyBytes === null) problems.push('KEYWARD_MAX_BODY must be a size with a unit (e.g. 10MiB, 2GiB)');

  const maxHeaderText = env.KEYWARD_MAX_HEADER_SIZE !== undefined && env.KEYWARD_MAX_HEADER_SIZE !== '' ? env.KEYWARD_MAX_HEADER_SIZE : MAX_HEADER_DEFAULT;
  const maxHeaderBytes = parseSize(maxHeaderText);
  // Node's parser takes up to about 2 GiB; below 1 KiB no real client gets through.
  if (maxHeaderBytes === null || maxHeaderBytes < 1024 || maxHeaderBytes > 1024 ** 3) {
    problems.push('KEYWARD_MAX_HEADER_SIZE must be a size from 1KiB to 1GiB (e.g. 16KiB)');
  }

  const upstreamHeaderText = env.KEYWARD_UPSTREAM_MAX_HEADER_SIZE !== undefined && env.KEYWARD_UPSTREAM_MAX_HEADER_SIZE !== '' ? env.KEYWARD_UPSTREAM_MAX_HEADER_SIZE : UPSTREAM_MAX_HEADER_DEFAULT;
  const upstreamMaxHeaderBytes = parseSize(upstreamHeaderText);
  if (upstreamMaxHeaderBytes === null || upstreamMaxHeaderBytes < 1024 || upstreamMaxHeaderBytes > 1024 ** 3) {
    problems.push('KEYWARD_UPSTREAM_MAX_HEADER_SIZE must be a size from 1KiB to 1GiB (e.g. 64KiB)');
  }

  const egressText = env.KEYWARD_EGRESS_FILTER ?? '';
  if (egressText !== '' && egressText !== 'on' && egressText !== 'off') problems.push('KEYWARD_EGRESS_FILTER must be on or off');

  let maxConnections = 10_000;
  const maxConnText = env.KEYWARD_MAX_CONNECTIONS ?? '';
  if (/^[1-9]\d{0,6}$/.test(maxConnText)) maxConnections = Number(maxConnText);
  else if (maxConnText !== '') problems.push('KEYWARD_MAX_CONNECTIONS must be a whole number from 1 to 9999999');

  const upstreamCa = optionalFile(env, 'KEYWARD_UPSTREAM_CA_FILE', readFile, problems);
  if (upstreamCa !== null && !upstreamCa.includes('-----BEGIN CERTIFICATE-----')) {
    problems.push('KEYWARD_UPSTREAM_CA_FILE must hold PEM certificates (-----BEGIN CERTIFICATE-----)');
  } else if (upstreamCa !== null) checkTls({ ca: upstreamCa }, 'KEYWARD_UPSTREAM_CA_FILE', problems);
  const tls = tlsConfig(env, readFile, problems);
  const admin = adminConfig(env, problems);
  const native = nativeRoutes(env, problems);

  const keysFile = keysFilePath(env, cwd);
  const databaseUrl = secret(env, 'KEYWARD_DATABASE_URL', readFile, problems);
  if (databaseUrl !== null && !/^postgres(ql)?:\/\//.test(databaseUrl)) problems.push('KEYWARD_DATABASE_URL must be a postgres:// URL');
  const stalenessText = env.KEYWARD_KEYS_MAX_STALENESS ?? '';
  const keysMaxStalenessMs = stalenessText === '' || stalenessText === '0' ? 0 : parseDuration(stalenessText);
  if (keysMaxStalenessMs === null) problems.push('KEYWARD_KEYS_MAX_STALENESS must be a duration with a unit (e.g. 5m), or 0 for never');

  let workers = 1;
  const workersText = env.KEYWARD_WORKERS ?? '';
  if (workersText === 'auto') workers = Math.max(1, availableParallelism());
  else if (/^[1-9]\d{0,2}$/.test(workersText)) workers = Number(workersText);
  else if (workersText !== '') problems.push('KEYWARD_WORKERS must be a whole number from 1 to 999, or auto');

  const routes = UPSTREAMS.map((spec) => route(env, spec, readFile, native, problems)).filter((r): r is Route => r !== null);

  if (problems.length > 0) throw new ConfigError(problems);
  return freezeDeep({
    host,
    port: listenPort,
    keysFile,
    logLevel,
    upstreamTimeoutMs: times.upstreamTimeoutMs as number,
    connectTimeoutMs: times.connectTimeoutMs as number,
    headersTimeoutMs: times.headersTimeoutMs as number,
    keepAliveTimeoutMs: times.keepAliveTimeoutMs as number,
    drainTimeoutMs: times.drainTimeoutMs as number,
    maxBodyBytes: maxBodyBytes as number,
    idleTimeoutMs: times.idleTimeoutMs as number,
    maxHeaderBytes: maxHeaderBytes as number,
    upstreamMaxHeaderBytes: upstreamMaxHeaderBytes as number,
    upstreamIdleMs: times.upstreamIdleMs as number,
    egressFilter: egressText !== 'off',
    maxConnections,
    upstreamCa,
    tls,
    admin,
    workers,
    databaseUrl,
    keysMaxStalenessMs: keysMaxStalenessMs ?? 0,
    routes,
    enabledRoutes: routes.filter((r) => r.credential !== null).map((r) => r.name),
  });
}
