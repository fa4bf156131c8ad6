// Configuration from the environment (design §4), validated once: every
// problem is collected and reported together with the option's name, then the
// result is frozen. Pure apart from reading secret files through `readFile`.
import { availableParallelism } from 'node:os';
import { join, resolve } from 'node:path';
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
  /** Gateway processes (node:cluster); 1 runs in-process. */
  readonly workers: number;
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
] as const;
const MAX_BODY_DEFAULT = '2GiB';
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

function route(env: Env, spec: UpstreamSpec, readFile: ReadFile, problems: string[]): Route | null {
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
    prefix: `/${spec.name}/`,
    methods: new Set(spec.methods),
    target: where.target,
    basePath: where.basePath,
    credential,
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

export function loadConfig(env: Env, readFile: ReadFile, cwd: string): Config {
  const problems: string[] = [];

  const host = env.KEYWARD_HOST !== undefined && env.KEYWARD_HOST !== '' ? env.KEYWARD_HOST : '127.0.0.1';
  let port = 8080;
  if (env.KEYWARD_PORT !== undefined && env.KEYWARD_PORT !== '') {
    port = Number(env.KEYWARD_PORT);
    if (!/^\d+$/.test(env.KEYWARD_PORT) || port > 65535) problems.push('KEYWARD_PORT must be an integer from 0 to 65535');
  }

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

  const keysFile = keysFilePath(env, cwd);

  let workers = 1;
  const workersText = env.KEYWARD_WORKERS ?? '';
  if (workersText === 'auto') workers = Math.max(1, availableParallelism());
  else if (/^[1-9]\d{0,2}$/.test(workersText)) workers = Number(workersText);
  else if (workersText !== '') problems.push('KEYWARD_WORKERS must be a whole number from 1 to 999, or auto');

  const routes = UPSTREAMS.map((spec) => route(env, spec, readFile, problems)).filter((r): r is Route => r !== null);

  if (problems.length > 0) throw new ConfigError(problems);
  return freezeDeep({
    host,
    port,
    keysFile,
    logLevel,
    upstreamTimeoutMs: times.upstreamTimeoutMs as number,
    connectTimeoutMs: times.connectTimeoutMs as number,
    headersTimeoutMs: times.headersTimeoutMs as number,
    keepAliveTimeoutMs: times.keepAliveTimeoutMs as number,
    drainTimeoutMs: times.drainTimeoutMs as number,
    maxBodyBytes: maxBodyBytes as number,
    workers,
    routes,
    enabledRoutes: routes.filter((r) => r.credential !== null).map((r) => r.name),
  });
}
