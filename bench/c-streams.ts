// Streams measured so that the load generator and the upstream cannot hide
// what a gateway spends per byte: Debian's `wrk` (C) as the client, nginx
// serving the bodies from files as the upstream, both on one core, and the
// gateway under test alone on the other (`taskset`). Each gateway's CPU is
// its whole process tree, every thread (bench/proc.ts), per MiB streamed.
// bench/README.md, "Streams with a C client", says why the Node-client rows
// alone misled.
import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { dataset } from './dataset.ts';
import { cpuUs, tree } from './proc.ts';
import { fmt, median, pct, range, roundOrder, spreadOf } from './stats.ts';
import { UPSTREAMS } from '../src/request/routes.ts';
import { acceptedCredentials, freePort, stopper, waitReady, type Secrets, type System } from './systems.ts';

const MiB = 1024 * 1024;
/** The core the gateway under test has to itself, and the one the client and the upstream share. */
const GATEWAY_CORE = '0';
const LOAD_CORE = '1';

export interface Body {
  readonly name: 'binary' | 'json';
  readonly title: string;
  readonly route: string;
  readonly method: 'GET' | 'POST';
  readonly path: string;
}

export const BODIES: readonly Body[] = [
  { name: 'binary', title: '10 MiB binary (GET /speech/v1/history/x/audio)', route: 'speech', method: 'GET', path: '/v1/history/x/audio' },
  {
    name: 'json',
    title: '10 MiB JSON dataset (POST /scraper/v2/acts/x/run-sync-get-dataset-items)',
    route: 'scraper',
    method: 'POST',
    path: '/v2/acts/x/run-sync-get-dataset-items',
  },
];

/** What the instrument needs from the machine: wrk, nginx, taskset and two cores. Null when all are there, else what is missing. */
export function missing(nginxBin: string | null): string | null {
  const has = (cmd: string, arg: string): boolean => spawnSync(cmd, [arg], { stdio: 'ignore' }).status !== null;
  const lacking = [has('wrk', '-v') ? '' : 'wrk', nginxBin === null ? 'nginx' : '', has('taskset', '-V') ? '' : 'taskset'].filter(Boolean);
  if (lacking.length > 0) return `${lacking.join(', ')} not installed (apt-get install ${lacking.join(' ')})`;
  const cores = spawnSync('nproc', ['--all'], { encoding: 'utf8' }).stdout.trim();
  return Number(cores) >= 2 ? null : `${cores} core: the gateway needs a core of its own`;
}

/** Pin every thread of a process tree to a core (threads started later inherit it). */
export function pin(pid: number, core: string): void {
  for (const p of tree(pid)) spawnSync('taskset', ['-a', '-cp', core, String(p)], { stdio: 'ignore' });
}

/**
 * nginx serving the two bodies from files, checking each route's upstream
 * credential as the stand-in does, on a port per route: each route's
 * upstream on an origin of its own, as deployed (the egress scan reads an
 * answer for the secrets its origin was given, docs/security.md).
 */
export async function fileUpstream(nginxBin: string, s: Secrets, dir: string): Promise<{ ports: Readonly<Record<string, number>>; stop: () => Promise<void> }> {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, 'audio.bin'), randomBytes(10 * MiB));
  writeFileSync(join(dir, 'dataset.json'), dataset(10 * MiB));
  const ports: Record<string, number> = {};
  for (const spec of UPSTREAMS) ports[spec.name] = await freePort();
  // Each route's accepted credentials (1 to 3, and the worst case's), mapped to whether the header is one of them.
  const accepted = (route: string): { variable: string; map: string } => {
    const a = acceptedCredentials(s, route);
    const variable = `$ok_${route}`;
    return { variable, map: `map $http_${a.name.replace(/-/g, '_')} ${variable} { ${a.values.map((v) => `"${v}" 1;`).join(' ')} default 0; }` };
  };
  const check = (route: string): string => `if (${accepted(route).variable} = 0) { return 401; }`;
  const server = (route: string, locations: string): string => `
  server {
    listen 127.0.0.1:${ports[route]};
    ${locations}
    location / { return 404; }
  }`;
  // Run as root (a container), nginx's workers would take another user, who cannot read the run's private directory.
  const user = process.getuid?.() === 0 ? 'user root;' : '';
  const conf = `
daemon off;
${user}
master_process on;
worker_processes 1;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  # Keys at the providers' real lengths: a map of them needs more than the default 64-byte bucket.
  map_hash_bucket_size 256;
  ${UPSTREAMS.map((spec) => accepted(spec.name).map).join('\n  ')}
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  fastcgi_temp_path ${dir}/fastcgi;
  uwsgi_temp_path ${dir}/uwsgi;
  scgi_temp_path ${dir}/scgi;
  sendfile on;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  ${server('speech', `location = /v1/history/x/audio { ${check('speech')} default_type audio/mpeg; alias ${dir}/audio.bin; }`)}
  ${server(
    'scraper',
    // A POST to a static file is refused with 405; the redirect to a URI turns it into a GET of the file.
    `location = /v2/acts/x/run-sync-get-dataset-items { ${check('scraper')} error_page 405 =200 /dataset.json; alias ${dir}/dataset.json; }
    location = /dataset.json { internal; default_type "application/json; charset=utf-8"; alias ${dir}/dataset.json; }`,
  )}
  ${server('seo', '')}
}
`;
  writeFileSync(join(dir, 'nginx.conf'), conf);
  const child = spawn('taskset', ['-c', LOAD_CORE, nginxBin, '-p', dir, '-c', join(dir, 'nginx.conf')], { stdio: ['ignore', 'ignore', 'inherit'] });
  for (const port of Object.values(ports)) await waitReady(`http://127.0.0.1:${port}`, 10_000, child);
  return { ports, stop: stopper(child) };
}

export interface Round {
  readonly bytes: number;
  readonly seconds: number;
  readonly errors: number;
  /** MB/s (10^6 bytes) read by the client. */
  readonly mbps: number;
  /** CPU of the gateway's whole process tree per MiB the client read, µs. */
  readonly cpuUsPerMiB: number;
}

/** One wrk run against a system: 8 connections on one thread, pinned beside the upstream. */
export async function wrkRound(sys: System, body: Body, seconds: number, dir: string): Promise<Round> {
  const headers = Object.entries({ ...sys.headers(body.route), ...(body.method === 'POST' ? { 'content-type': 'application/json' } : {}) });
  const script = join(dir, `wrk-${body.name}.lua`);
  writeFileSync(
    script,
    [
      `wrk.method = "${body.method}"`,
      body.method === 'POST' ? 'wrk.body = "{}"' : '',
      ...headers.map(([k, v]) => `wrk.headers["${k}"] = "${v}"`),
      'done = function(summary, latency, requests)',
      '  local e = summary.errors',
      '  io.write(string.format("WRK %d %d %d %d\\n", summary.requests, summary.bytes, summary.duration, e.connect + e.read + e.write + e.status + e.timeout))',
      'end',
    ].join('\n'),
  );
  const pids = tree(sys.pid as number);
  const before = cpuUs(pids);
  const out = await new Promise<string>((resolve, reject) => {
    const child = spawn(
      'taskset',
      ['-c', LOAD_CORE, 'wrk', '-t1', '-c8', `-d${seconds}s`, '--timeout', '20s', '-s', script, `${sys.base}${sys.prefix(body.route)}${body.path}`],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let text = '';
    child.stdout.on('data', (d: Buffer) => (text += d.toString()));
    child.stderr.on('data', (d: Buffer) => (text += d.toString()));
    const deadline = setTimeout(() => child.kill('SIGKILL'), (seconds + 30) * 1000);
    child.once('exit', () => {
      clearTimeout(deadline);
      resolve(text);
    });
    child.once('error', reject);
  });
  const cpu = cpuUs(pids) - before;
  const m = /WRK (\d+) (\d+) (\d+) (\d+)/.exec(out);
  if (m === null) throw new Error(`wrk against ${sys.name}: ${out.trim()}`);
  const [requests, bytes, us, errors] = m.slice(1).map(Number) as [number, number, number, number];
  return { bytes, seconds: us / 1e6, errors: requests === 0 ? 1 : errors, mbps: bytes / (us / 1e6) / 1e6, cpuUsPerMiB: cpu / (bytes / MiB) };
}

export type Results = Record<string, Record<string, Round[]>>;

/** A warm-up round, then `rounds` rounds, each in an order of its own; both bodies on every system. */
export async function measure(systems: readonly System[], seconds: number, rounds: number, dir: string, log: (t: string) => void): Promise<Results> {
  const results: Results = {};
  for (const body of BODIES) {
    const byName: Record<string, Round[]> = (results[body.name] = {});
    for (let round = -1; round < rounds; round++) {
      for (const i of roundOrder(systems.length, round + 1)) {
        const sys = systems[i] as System;
        const r = await wrkRound(sys, body, round < 0 ? Math.max(2, Math.ceil(seconds / 3)) : seconds, dir);
        if (round >= 0) (byName[sys.name] ??= []).push(r);
        log(
          `c-${body.name.padEnd(6)} ${round < 0 ? 'warm-up' : `round ${round + 1}/${rounds}`} ${sys.name.padEnd(34)} ${fmt(r.mbps, 0)} MB/s, ${fmt(r.cpuUsPerMiB, 0)} µs CPU/MiB${r.errors > 0 ? `, ${r.errors} errors (round discarded)` : ''}`,
        );
      }
    }
  }
  return results;
}

/** `a` over `b` round by round (each round ran both), clean rounds only. */
export function pairs(a: readonly Round[] | undefined, b: readonly Round[] | undefined, k: 'mbps' | 'cpuUsPerMiB'): number[] {
  return (a ?? [])
    .map((m, i) => {
      const o = (b ?? [])[i];
      return m.errors === 0 && o !== undefined && o.errors === 0 ? m[k] / o[k] : NaN;
    })
    .filter((x) => Number.isFinite(x));
}

export interface Held {
  readonly label: string;
  readonly rounds: number[];
  readonly bound: number;
  readonly cmp: '<=' | '>=';
  readonly unit: string;
}

/**
 * The report's section and the design's stream targets: CPU per MiB ≤ 1.05×
 * the naive peer's, the filter ≤ 5 % of it (one less the same gateway's CPU
 * per MiB with the filter off over keyward's), throughput ≥ 0.95×.
 */
export function section(
  results: Results,
  names: readonly string[],
  peer: string,
  noFilter: string,
  three?: string,
  strides: Readonly<Record<string, (route: string) => number>> = {},
): { lines: string[]; targets: Held[] } {
  const lines = [
    '## streams with a C client: wrk, an nginx upstream serving files, the gateway on a core of its own',
    '',
    `\`wrk -t1 -c8\` and the nginx upstream pinned to core ${LOAD_CORE}, each gateway's every thread to core ${GATEWAY_CORE} (\`taskset\`), so neither the client nor the upstream takes CPU from the gateway under test. CPU per MiB is the gateway's whole process tree (every thread, from schedstat) over the bytes the client read.`,
    '',
  ];
  const targets: Held[] = [];
  for (const body of BODIES) {
    const byName = results[body.name] ?? {};
    lines.push(`### ${body.title}`, '', '| system | MB/s | CPU µs per MiB | clean rounds |', '|---|---:|---:|---:|');
    for (const name of names) {
      const clean = (byName[name] ?? []).filter((r) => r.errors === 0);
      const v = (k: 'mbps' | 'cpuUsPerMiB'): number[] => clean.map((r) => r[k]);
      lines.push(
        `| ${name} | ${fmt(median(v('mbps')), 0)}${pct(spreadOf(v('mbps')))} | ${fmt(median(v('cpuUsPerMiB')), 0)}${pct(spreadOf(v('cpuUsPerMiB')))} | ${clean.length}/${(byName[name] ?? []).length} |`,
      );
    }
    const ratios = names
      .filter((n) => n !== 'keyward')
      .map((n) => {
        const cpu = pairs(byName.keyward, byName[n], 'cpuUsPerMiB');
        const mb = pairs(byName.keyward, byName[n], 'mbps');
        return cpu.length === 0 ? '' : `vs ${n}: CPU/MiB ${fmt(median(cpu), 2)}× (rounds ${range(cpu)}), MB/s ${fmt(median(mb), 2)}× (rounds ${range(mb)})`;
      })
      .filter(Boolean);
    const sampled = Object.entries(strides).map(([name, stride]) => `${name} ${stride(body.route)} bytes`);
    lines.push('', `keyward ${ratios.join('; ')}.`, '');
    if (sampled.length > 0) lines.push(`The scan's stride (a window read every so many bytes) on this route: ${sampled.join('; ')}.`, '');
    const cpu = pairs(byName.keyward, byName[peer], 'cpuUsPerMiB');
    const mb = pairs(byName.keyward, byName[peer], 'mbps');
    const filter = pairs(byName[noFilter], byName.keyward, 'cpuUsPerMiB').map((x) => 1 - x);
    if (cpu.length > 0) targets.push({ label: `${body.title}, C client: CPU per MiB vs the naive peer`, rounds: cpu, bound: 1.05, cmp: '<=', unit: '×' });
    if (mb.length > 0) targets.push({ label: `${body.title}, C client: throughput vs the naive peer`, rounds: mb, bound: 0.95, cmp: '>=', unit: '×' });
    if (filter.length > 0)
      targets.push({ label: `${body.title}, C client: the egress filter's share of keyward's CPU per MiB`, rounds: filter, bound: 0.05, cmp: '<=', unit: '' });
    // Several credentials per route: the scan's table holds every one, so a byte costs the same (docs/credentials.md).
    const threeCpu = three === undefined ? [] : pairs(byName[three], byName.keyward, 'cpuUsPerMiB');
    if (threeCpu.length > 0)
      targets.push({ label: `${body.title}, C client: three credentials per route vs one, CPU per MiB`, rounds: threeCpu, bound: 1.05, cmp: '<=', unit: '×' });
  }
  return { lines, targets };
}
