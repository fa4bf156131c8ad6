// The systems compared side by side, each in its own process(es) so CPU and
// memory are measured per system: direct (the upstream itself, the limit),
// keyward, the naive http-proxy-3 peer, and nginx when it is installed.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { openSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { randomBytes } from 'node:crypto';
import { freePort } from '../src/process/listen.ts';
import { secretForms, Secrets as SecretTable } from '../src/request/egress.ts';
import { providerEnv, UPSTREAMS } from '../src/request/routes.ts';

/** A route name of the provider table (routes.ts). */
export type Route = string;

/**
 * Where the upstream listens: one port for every route (the Node stand-in),
 * or a port per route, each route on an origin of its own as deployed (the
 * C-client rows' nginx; docs/security.md, "What each answer is scanned for").
 */
export type Ports = number | Readonly<Record<Route, number>>;

/** The upstream URL of `route`. */
export function upstreamUrl(ports: Ports, route: Route): string {
  const port = typeof ports === 'number' ? ports : ports[route];
  if (port === undefined) throw new Error(`no upstream port for ${route}`);
  return `http://127.0.0.1:${port}`;
}

export interface Secrets {
  /** Each provider's upstream secrets, by route name (one per `secretEnvs` entry). */
  readonly upstream: Readonly<Record<string, readonly string[]>>;
  /** Credentials 2 and 3 of each route (docs/credentials.md), for the row with three per route; the stand-ins accept each. */
  readonly more: Readonly<Record<string, ReadonlyArray<readonly string[]>>>;
  /** A credential of the shortest length keyward scans for (8 characters), by route: the C-client rows' worst case; the file upstream accepts it. */
  readonly worst?: Readonly<Record<string, readonly string[]>>;
  readonly clientToken: string;
}

/** The provider table's entry for `route` (routes.ts). */
function specOf(route: Route): (typeof UPSTREAMS)[number] {
  const spec = UPSTREAMS.find((u) => u.name === route);
  if (spec === undefined) throw new Error(`no provider ${route}`);
  return spec;
}

/** The options that give every route its credentials 2 and 3 (`KEYWARD_SPEECH_KEY_2`, …). */
export function moreCredentialsEnv(s: Secrets): Record<string, string> {
  const env: Record<string, string> = {};
  for (const spec of UPSTREAMS)
    (s.more[spec.name] ?? []).forEach((secrets, i) => spec.secretEnvs.forEach((name, j) => (env[`${name}_${i + 2}`] = secrets[j] ?? '')));
  return env;
}

/** Every header value an upstream of `route` accepts as its credential: credential 1's first, then the others'. */
export function acceptedCredentials(
  s: Pick<Secrets, 'upstream' | 'more' | 'worst'>,
  route: Route,
): { readonly name: string; readonly values: readonly string[] } {
  const spec = specOf(route);
  const worst = s.worst?.[route];
  const all = [s.upstream[route] ?? [], ...(s.more[route] ?? []), ...(worst === undefined ? [] : [worst])].map((secrets) => spec.credential(secrets));
  return { name: all[0]?.[0] ?? '', values: all.map(([, v]) => v) };
}

/** Made-up upstream secrets for every provider of the table, and a client token. */
export function benchSecrets(tag: string, clientToken: string): Secrets {
  return {
    upstream: Object.fromEntries(UPSTREAMS.map((spec) => [spec.name, spec.sampleSecrets(`bench${tag}`)])),
    more: Object.fromEntries(UPSTREAMS.map((spec) => [spec.name, [spec.sampleSecrets(`bench${tag}c2`), spec.sampleSecrets(`bench${tag}c3`)]])),
    clientToken,
  };
}

/** `n` characters of [a-z0-9], as the providers' keys are made. */
function alnum(n: number): string {
  const abc = 'abcdefghijklmnopqrstuvwxyz0123456789';
  return [...randomBytes(n)].map((b) => abc[b % abc.length]).join('');
}

/**
 * Made-up secrets at the providers' real lengths, as deployed: the scraper
 * platform's token `apify_api_` and 36 characters (46), the voice
 * provider's key `sk_` and 48 hex digits (51), the SEO provider's login (an
 * e-mail address) and its 16-character API password. `worst`: an
 * 8-character voice key, the shortest keyward scans for.
 */
export function deployedSecrets(clientToken: string): Secrets {
  const one = (route: Route): readonly string[] => {
    if (route === 'scraper') return [`apify_api_${alnum(36)}`];
    if (route === 'speech') return [`sk_${randomBytes(24).toString('hex')}`];
    if (route === 'seo') return [`${alnum(10)}@example.com`, alnum(16)];
    throw new Error(`no deployed secret shape for ${route}`);
  };
  return {
    upstream: Object.fromEntries(UPSTREAMS.map((spec) => [spec.name, one(spec.name)])),
    more: Object.fromEntries(UPSTREAMS.map((spec) => [spec.name, [one(spec.name), one(spec.name)]])),
    worst: { speech: [alnum(8)] },
    clientToken,
  };
}

/**
 * The stride the egress scan samples an answer of `route` at (egress.ts,
 * BodyScan.matches) when every route has `perRoute` credentials of `s` and
 * each route is on an origin of its own: its shortest secret form less three.
 */
export function strideOf(s: Secrets, route: Route, worst = false, perRoute = 1): number {
  const spec = specOf(route);
  const credentials = worst && s.worst?.[route] !== undefined ? [s.worst[route]] : [s.upstream[route] ?? [], ...(s.more[route] ?? [])].slice(0, perRoute);
  const forms = credentials.flatMap((c) => spec.secretForms(c));
  return new SecretTable(secretForms([{ name: route, secretForms: forms } as never]).forms).stride;
}

/** The secrets as one variable for the stand-in and the naive peer (their own processes). */
const secretsEnv = (s: Secrets): Record<string, string> => ({ BENCH_SECRETS: JSON.stringify(s.upstream), BENCH_MORE_SECRETS: JSON.stringify(s.more) });

export interface System {
  readonly name: string;
  readonly base: string;
  /** Root of the process tree measured for CPU and memory; null: not measured. */
  readonly pid: number | null;
  /** Path prefix for a route ('' when talking to the upstream directly). */
  prefix(route: Route): string;
  /** What a client sends to authenticate on this system. */
  headers(route: Route): Record<string, string>;
  stop(): Promise<void>;
  /** Start a new process with the same settings (fresh memory), returning the new system. */
  restart?(): Promise<System>;
  /** keyward's admin listener, to read its metrics (the tail's causes). */
  readonly admin?: string;
}

export const ROOT = fileURLToPath(new URL('..', import.meta.url));
export const NODE_ARGS = ['--experimental-strip-types', '--disable-warning=ExperimentalWarning'];

/** The credential a route's upstream expects, as a header. */
export function upstreamHeaders(s: Secrets, route: Route): Record<string, string> {
  const spec = specOf(route);
  const [name, value] = spec.credential(s.upstream[route] ?? []);
  return { [name]: value };
}

export { freePort };

/** Poll until the system answers any HTTP response. */
export async function waitReady(base: string, timeoutMs: number, child?: ChildProcess): Promise<void> {
  const until = Date.now() + timeoutMs;
  for (;;) {
    if (child?.exitCode !== null && child?.exitCode !== undefined) throw new Error(`${base}: exited with ${child.exitCode}`);
    const ok = await new Promise<boolean>((resolve) => {
      const req = http.get(`${base}/`, { agent: false }, (res) => {
        res.resume();
        resolve(true);
      });
      req.on('error', () => resolve(false));
      req.setTimeout(1000, () => req.destroy());
    });
    if (ok) return;
    if (Date.now() > until) throw new Error(`${base} not ready within ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

export function stopper(child: ChildProcess): () => Promise<void> {
  return () =>
    new Promise((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) return resolve();
      child.once('exit', () => resolve());
      child.kill('SIGTERM');
      setTimeout(() => child.kill('SIGKILL'), 5_000).unref();
    });
}

/**
 * Every limit set, none ever reached: what admission and accounting cost a
 * request. The small request is a scraper run-start, so with the scraper's
 * budget it is also the row "a scraper request with and without a budget":
 * its run capped (`maxTotalChargeUsd` appended) and settled after the fact.
 * A run reserves its cap: a tenth of the budget without a run cap, so the
 * bench key caps each run at a cent and keeps thousands in flight.
 */
export const EVERY_LIMIT = {
  runCap: 0.01,
  rate: '100000000/s',
  burst: 100_000_000,
  concurrency: 1_000_000,
  quota: '1000000000/month',
  budgets: { scraper: '1000000000/month', seo: '1000000000/month', speech: '100000000000/month' },
};

/** keyward exactly as users run it: bin/keyward serve (the wrapper execs Node, so the pid is Node's). */
function startKeyward(env: Record<string, string>, logFile = '/dev/null', root = ROOT): ChildProcess {
  const out = openSync(logFile, 'w');
  return spawn(join(root, 'bin/keyward'), ['serve'], { env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['ignore', out, 'inherit'] });
}

export async function startUpstreamProcess(s: Secrets, slowMs: number): Promise<{ port: number; pid: number; stop: () => Promise<void> }> {
  const child = spawn(process.execPath, [...NODE_ARGS, join(ROOT, 'bench/upstream.ts')], {
    env: {
      PATH: process.env.PATH ?? '',
      ...secretsEnv(s),
      BENCH_SLOW_MS: String(slowMs),
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout?.once('data', (d: Buffer) => resolve((JSON.parse(d.toString()) as { port: number }).port));
    child.once('exit', (code) => reject(new Error(`bench upstream exited ${code}`)));
  });
  return { port, pid: child.pid as number, stop: stopper(child) };
}

export function direct(upstreamPort: number, upstreamPid: number, s: Secrets): System {
  return {
    name: 'direct',
    base: `http://127.0.0.1:${upstreamPort}`,
    pid: upstreamPid,
    prefix: () => '',
    headers: (route) => upstreamHeaders(s, route),
    stop: async () => undefined,
  };
}

/** A gateway under test: clients send the bench client token and use the route prefixes. */
function gateway(name: string, base: string, child: ChildProcess, s: Secrets, again: () => Promise<System>): System {
  const stop = stopper(child);
  return {
    name,
    base,
    pid: child.pid as number,
    prefix: (r) => `/${r}`,
    headers: () => ({ authorization: `Bearer ${s.clientToken}` }),
    stop,
    restart: async () => {
      await stop();
      return again();
    },
  };
}

/** `root`: another built checkout of keyward (`--against`), for a same-run A/B of two builds. */
export async function keyward(
  upstreamPort: Ports,
  s: Secrets,
  keysFile: string,
  name = 'keyward',
  extraEnv: Record<string, string> = {},
  logFile?: string,
  root = ROOT,
): Promise<System & { startupMs: number }> {
  const port = await freePort();
  const adminPort = await freePort();
  const started = Date.now();
  const child = startKeyward(
    {
      KEYWARD_HOST: '127.0.0.1',
      KEYWARD_PORT: String(port),
      KEYWARD_KEYS_FILE: keysFile,
      KEYWARD_LOG_LEVEL: 'info',
      // Defaults as users run them, metrics included; an admin port of its own
      // so that several gateways can run side by side (and the bench reads its metrics).
      KEYWARD_ADMIN_PORT: String(adminPort),
      ...Object.assign({}, ...UPSTREAMS.map((spec) => providerEnv(spec, upstreamUrl(upstreamPort, spec.name), s.upstream[spec.name] ?? []))),
      ...extraEnv,
    },
    logFile,
    root,
  );
  const base = `http://127.0.0.1:${port}`;
  await waitReady(base, 60_000, child);
  const admin = extraEnv.KEYWARD_ADMIN_PORT === 'off' ? undefined : `http://127.0.0.1:${adminPort}`;
  return {
    ...gateway(name, base, child, s, () => keyward(upstreamPort, s, keysFile, name, extraEnv, logFile, root)),
    startupMs: Date.now() - started,
    ...(admin === undefined ? {} : { admin }),
  };
}

/** `flags`: Node flags for the peer (none: Node's defaults, as the peer is written), under a name of its own. */
export async function naive(upstreamPort: Ports, s: Secrets, flags: readonly string[] = [], name = 'naive http-proxy-3'): Promise<System> {
  const child = spawn(process.execPath, [...flags, ...NODE_ARGS, join(ROOT, 'bench/naive.ts')], {
    env: {
      PATH: process.env.PATH ?? '',
      BENCH_UPSTREAM_PORTS: JSON.stringify(upstreamPort),
      BENCH_CLIENT_TOKEN: s.clientToken,
      ...secretsEnv(s),
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout?.once('data', (d: Buffer) => resolve((JSON.parse(d.toString()) as { port: number }).port));
    child.once('exit', (code) => reject(new Error(`naive peer exited ${code}`)));
  });
  return gateway(name, `http://127.0.0.1:${port}`, child, s, () => naive(upstreamPort, s, flags, name));
}

export function nginxBinary(): string | null {
  for (const candidate of ['nginx', '/usr/sbin/nginx']) {
    const probe = spawnSync(candidate, ['-v'], { stdio: 'ignore' });
    if (probe.status === 0) return candidate;
  }
  return null;
}

/**
 * nginx as a gateway would configure it: one worker (keyward is one process),
 * a keep-alive upstream, no buffering either way, a `map` bearer check and the
 * same credential swap.
 */
export async function nginx(binary: string, upstreamPort: Ports, s: Secrets, dir: string): Promise<System> {
  const port = await freePort();
  // The client's Authorization never goes upstream: replaced by the credential, or cleared.
  const location = (spec: (typeof UPSTREAMS)[number]): string => {
    const [name, value] = spec.credential(s.upstream[spec.name] ?? []);
    const set =
      name === 'authorization' ? `proxy_set_header Authorization "${value}";` : `proxy_set_header Authorization ""; proxy_set_header ${name} "${value}";`;
    return `
    location /${spec.name}/ {
      if ($kw_client = "") { return 401; }
      limit_except ${spec.methods.join(' ')} { deny all; }
      ${set}
      proxy_pass http://up_${spec.name}/;
    }`;
  };
  const conf = `
daemon off;
master_process on;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
worker_rlimit_nofile 20000;
events { worker_connections 8192; }
http {
  access_log /dev/null;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_max_body_size 0;
  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_buffering off;
  proxy_request_buffering off;
  map_hash_bucket_size 128;
  map $http_authorization $kw_client { default ""; "Bearer ${s.clientToken}" "bench"; }
  ${UPSTREAMS.map((spec) => `upstream up_${spec.name} { server ${upstreamUrl(upstreamPort, spec.name).slice('http://'.length)}; keepalive 256; keepalive_requests 1000000; }`).join('\n  ')}
  server {
    listen 127.0.0.1:${port};
    ${UPSTREAMS.map(location).join('\n')}
    location / { return 404; }
  }
}
`;
  writeFileSync(join(dir, 'nginx.conf'), conf);
  const child = spawn(binary, ['-p', dir, '-c', join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'inherit'] });
  const base = `http://127.0.0.1:${port}`;
  await waitReady(base, 10_000, child);
  return gateway('nginx', base, child, s, () => nginx(binary, upstreamPort, s, dir));
}
