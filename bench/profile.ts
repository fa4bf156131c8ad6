// Where the CPU goes: `npm run bench:profile -- small 8`, or `-- stream 8 --peer`,
// or `-- small 8 --limited` (the bench key with every limit).
// Starts the bench upstream and keyward (and with --peer the naive
// http-proxy-3 peer) with --cpu-prof, drives the same load at each in turn,
// stops them cleanly (which writes the profiles) and prints, per request:
// time by module, the hottest functions, and keyward's own functions with
// everything they call (inclusive time), so that the gap to the peer can be
// read function by function. The profile files stay for a closer look in a
// Chrome DevTools Performance panel (a flame chart).
//
//   PROFILE_FLAGS='--no-allocation-site-pretenuring'   extra Node flags for keyward
//   PROFILE_ENV='KEYWARD_EGRESS_FILTER=off'            extra environment for keyward
//   PROFILE_PEER_FLAGS='--max-semi-space-size=4'        extra Node flags for the naive peer
//   --c-client                                         stream/json: wrk and an nginx upstream, the gateway on a core of its own
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import autocannon from 'autocannon';
import { serialiseKeysFile } from '../src/keys/file-store.ts';
import { generateToken, tokenDigest } from '../src/keys/token.ts';
import { providerEnv, UPSTREAMS } from '../src/request/routes.ts';
import { BODIES, fileUpstream, missing, pin, wrkRound, type Body } from './c-streams.ts';
import { KEYWARD_NODE_FLAGS } from './flags.ts';
import {
  benchSecrets,
  deployedSecrets,
  EVERY_LIMIT,
  freePort,
  nginxBinary,
  NODE_ARGS,
  startUpstreamProcess,
  upstreamUrl,
  waitReady,
  type Ports,
  type Secrets,
} from './systems.ts';

interface Node {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: Node[];
  samples: number[];
  timeDeltas: number[];
}

const { values: args, positionals } = parseArgs({
  allowPositionals: true,
  options: { peer: { type: 'boolean' }, limited: { type: 'boolean' }, 'c-client': { type: 'boolean' } },
});
// --c-client (stream and json only): wrk as the client and nginx serving the bodies, both on one core,
// the gateway pinned to the other, as the bench's C-client rows measure (bench/c-streams.ts).
const cClient = args['c-client'] === true && (positionals[0] === 'stream' || positionals[0] === 'json');
if (cClient) pin(process.pid, '1');
const scenario = positionals[0] ?? 'small';
const seconds = Number(positionals[1] ?? 8);
const root = fileURLToPath(new URL('..', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'keyward-profile-'));
// Secrets of the lengths each row of bench/run.ts uses (the egress scan
// samples a window every shortest secret less three bytes): the C-client
// rows' are the providers' real lengths, each route on an origin of its own.
const s: Secrets = cClient ? deployedSecrets(generateToken()) : benchSecrets(randomBytes(8).toString('hex'), generateToken());
const keys = join(dir, 'keys.json');
writeFileSync(
  keys,
  serialiseKeysFile([
    {
      id: 'key_p',
      name: 'p',
      digest: `sha256:${tokenDigest(s.clientToken)}`,
      created: new Date().toISOString(),
      expires: null,
      revoked: null,
      // --limited: the bench's key with every limit (none reached), to read what admission and accounting cost.
      ...(args.limited === true ? { limits: EVERY_LIMIT } : {}),
    },
  ]),
);
const extraEnv = Object.fromEntries(
  (process.env.PROFILE_ENV ?? '')
    .split(',')
    .filter(Boolean)
    .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
);
const extraFlags = (process.env.PROFILE_FLAGS ?? '').split(' ').filter(Boolean);
/** PROFILE_PEER_FLAGS: extra Node flags for the naive peer (keyward's own, to compare like with like). */
const peerFlags = (process.env.PROFILE_PEER_FLAGS ?? '').split(' ').filter(Boolean);

const nginxBin = nginxBinary();
if (cClient && missing(nginxBin) !== null) throw new Error(`--c-client: ${missing(nginxBin)}`);
const up = cClient ? await fileUpstream(nginxBin as string, s, join(dir, 'upstream')) : await startUpstreamProcess(s, 5000);
const ports: Ports = 'ports' in up ? up.ports : up.port;

interface Started {
  readonly name: string;
  readonly child: ChildProcess;
  readonly base: string;
  readonly profileDir: string;
}

async function startKeyward(): Promise<Started> {
  const port = await freePort();
  const profileDir = mkdtempSync(join(dir, 'keyward-'));
  const child = spawn(
    process.execPath,
    ['--cpu-prof', `--cpu-prof-dir=${profileDir}`, ...KEYWARD_NODE_FLAGS, ...extraFlags, join(root, 'dist/main.js'), 'serve'],
    {
      env: {
        PATH: process.env.PATH ?? '',
        KEYWARD_PORT: String(port),
        KEYWARD_ADMIN_PORT: '0',
        KEYWARD_KEYS_FILE: keys,
        ...Object.assign({}, ...UPSTREAMS.map((spec) => providerEnv(spec, upstreamUrl(ports, spec.name), s.upstream[spec.name] ?? []))),
        ...(process.env.KEYWARD_WORKERS ? { KEYWARD_WORKERS: process.env.KEYWARD_WORKERS } : {}),
        ...(process.env.KEYWARD_LOG_LEVEL ? { KEYWARD_LOG_LEVEL: process.env.KEYWARD_LOG_LEVEL } : {}),
        ...extraEnv,
      },
      stdio: ['ignore', 'ignore', 'inherit'],
    },
  );
  const base = `http://127.0.0.1:${port}`;
  await waitReady(base, 10_000, child);
  return { name: 'keyward', child, base, profileDir };
}

async function startPeer(): Promise<Started> {
  const profileDir = mkdtempSync(join(dir, 'naive-'));
  const child = spawn(process.execPath, ['--cpu-prof', `--cpu-prof-dir=${profileDir}`, ...peerFlags, ...NODE_ARGS, join(root, 'bench/naive.ts')], {
    env: {
      PATH: process.env.PATH ?? '',
      BENCH_UPSTREAM_PORTS: JSON.stringify(ports),
      BENCH_CLIENT_TOKEN: s.clientToken,
      BENCH_SECRETS: JSON.stringify(s.upstream),
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const port = await new Promise<number>((resolve, reject) => {
    child.stdout?.once('data', (d: Buffer) => resolve((JSON.parse(d.toString()) as { port: number }).port));
    child.once('exit', (code) => reject(new Error(`naive peer exited ${code}`)));
  });
  return { name: 'naive http-proxy-3', child, base: `http://127.0.0.1:${port}`, profileDir };
}

const auth = { authorization: `Bearer ${s.clientToken}` };

/** The scenario's load for `seconds`; the number of requests answered 2xx. */
async function load(base: string, pid: number): Promise<number> {
  if (cClient) {
    pin(pid, '0');
    const body = BODIES.find((b) => b.name === (scenario === 'stream' ? 'binary' : 'json')) as Body;
    const sys = { name: scenario, base, pid, prefix: (r: string) => `/${r}`, headers: () => auth, stop: async () => undefined };
    const r = await wrkRound(sys, body, seconds, dir);
    process.stderr.write(`${(r.bytes / 1e6).toFixed(0)} MB at ${r.mbps.toFixed(0)} MB/s, ${r.cpuUsPerMiB.toFixed(0)} µs CPU per MiB, ${r.errors} errors\n`);
    return Math.round(r.bytes / (10 * 1024 * 1024));
  }
  if (scenario === 'stream' || scenario === 'json') {
    // autocannon cannot keep up with 10 MiB bodies: plain clients that discard.
    const path = scenario === 'stream' ? '/speech/v1/history/x/audio' : '/scraper/v2/acts/x/run-sync-get-dataset-items';
    const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
    let done = 0;
    const until = Date.now() + seconds * 1000;
    await Promise.all(
      Array.from({ length: 8 }, async () => {
        while (Date.now() < until) {
          await new Promise<void>((resolve, reject) => {
            const req = http.request(`${base}${path}`, { method: scenario === 'stream' ? 'GET' : 'POST', headers: auth, agent }, (res) => {
              res.resume().on('end', () => {
                if (res.statusCode === 200) done++;
                resolve();
              });
            });
            req.on('error', reject);
            req.end();
          });
        }
      }),
    );
    agent.destroy();
    return done;
  }
  const options =
    scenario === 'latency'
      ? { url: `${base}/seo/v3/appendix/user_data`, method: 'GET' as const, headers: auth, connections: 1 }
      : {
          url: `${base}/scraper/v2/acts/x/runs`,
          method: 'POST' as const,
          headers: { ...auth, 'content-type': 'application/json' },
          body: '{}',
          connections: 64,
        };
  const result = await autocannon({ ...options, duration: seconds });
  process.stderr.write(`${result['2xx']} requests, ${result.non2xx} non-2xx, ${result.errors} errors\n`);
  return result['2xx'];
}

async function profileOf(start: () => Promise<Started>): Promise<{ name: string; file: string; profile: Profile; requests: number }> {
  const sys = await start();
  const requests = await load(sys.base, sys.child.pid as number);
  sys.child.kill('SIGTERM');
  await new Promise((r) => sys.child.once('exit', r));
  const file = readdirSync(sys.profileDir).find((f) => f.endsWith('.cpuprofile'));
  if (file === undefined) throw new Error(`no profile written for ${sys.name}`);
  const path = join(sys.profileDir, file);
  return { name: sys.name, file: path, profile: JSON.parse(readFileSync(path, 'utf8')) as Profile, requests };
}

/** Self and inclusive time by function and self time by module, in µs. */
function analyse(profile: Profile): { total: number; byModule: Map<string, number>; self: Map<string, number>; inclusive: Map<string, number> } {
  const nodes = new Map(profile.nodes.map((n) => [n.id, n]));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const selfById = new Map<number, number>();
  profile.samples.forEach((id, i) => selfById.set(id, (selfById.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));
  const name = (n: Node): string => {
    const url = n.callFrame.url.replace(`file://${root}`, '').replace(/^.*\/node_modules\//, 'node_modules/');
    return `${n.callFrame.functionName || '(anonymous)'} ${url}:${n.callFrame.lineNumber + 1}`;
  };
  const moduleOf = (n: Node): string => {
    const url = n.callFrame.url.replace(`file://${root}`, '');
    if (url === '') return n.callFrame.functionName;
    if (url.includes('/node_modules/'))
      return url
        .replace(/^.*\/node_modules\//, 'node_modules/')
        .split('/')
        .slice(0, 2)
        .join('/');
    return url.startsWith('/dist/') || url.startsWith('/src/') || url.startsWith('/bench/') ? url.slice(1) : (url.split('/')[0] ?? url);
  };
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  const byModule = new Map<string, number>();
  let total = 0;
  for (const [id, t] of selfById) {
    const n = nodes.get(id) as Node;
    total += t;
    self.set(name(n), (self.get(name(n)) ?? 0) + t);
    byModule.set(moduleOf(n), (byModule.get(moduleOf(n)) ?? 0) + t);
    // Each function once per sample, however deep its recursion.
    const seen = new Set<string>();
    for (let cur: number | undefined = id; cur !== undefined; cur = parent.get(cur)) {
      const k = name(nodes.get(cur) as Node);
      if (seen.has(k)) continue;
      seen.add(k);
      inclusive.set(k, (inclusive.get(k) ?? 0) + t);
    }
  }
  return { total, byModule, self, inclusive };
}

const top = (m: Map<string, number>, n: number, per: number, filter: (k: string) => boolean = () => true): string =>
  [...m.entries()]
    .filter(([k]) => filter(k))
    .sort((a, b) => b[1] - a[1])
    .slice(0, n)
    .map(([k, v]) => `${(v / per).toFixed(2).padStart(8)} µs  ${k}`)
    .join('\n');

const runs = [await profileOf(startKeyward)];
if (args.peer === true) runs.push(await profileOf(startPeer));
await up.stop();

const totals: string[] = [];
for (const r of runs) {
  const a = analyse(r.profile);
  const per = Math.max(1, r.requests);
  totals.push(`${r.name} ${(a.total / per).toFixed(1)} µs`);
  process.stdout.write(
    `\n# ${r.name}: ${r.requests} requests, ${(a.total / per).toFixed(1)} µs of samples per request (idle included)\nprofile: ${r.file}\n\nby module, µs per request:\n${top(a.byModule, 20, per)}\n\nhottest functions (self), µs per request:\n${top(a.self, 30, per)}\n`,
  );
  if (r.name === 'keyward')
    process.stdout.write(
      `\nkeyward's own functions, with all they call (inclusive), µs per request:\n${top(a.inclusive, 45, per, (k) => k.includes(' dist/'))}\n`,
    );
}
process.stdout.write(`\nper request: ${totals.join('; ')}\n`);
