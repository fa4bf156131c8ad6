// Profile keyward under one scenario's load: `npm run bench:profile -- small`.
// Starts the bench upstream and keyward with --cpu-prof, drives load, stops
// keyward cleanly (which writes the profile) and prints where the CPU went,
// by function and by module. The profile file stays for a closer look in a
// Chrome DevTools Performance panel.
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import http from 'node:http';
import { serialiseKeysFile } from '../src/keys/file-store.ts';
import { generateToken, tokenDigest } from '../src/keys/token.ts';
import { providerEnv, UPSTREAMS } from '../src/request/routes.ts';
import { benchSecrets, freePort, startUpstreamProcess, waitReady, type Secrets } from './systems.ts';
import { writeFileSync } from 'node:fs';

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

const scenario = process.argv[2] ?? 'small';
const seconds = Number(process.argv[3] ?? 8);
const root = fileURLToPath(new URL('..', import.meta.url));
const dir = mkdtempSync(join(tmpdir(), 'keyward-profile-'));
const s: Secrets = benchSecrets('profile', generateToken());
const keys = join(dir, 'keys.json');
writeFileSync(keys, serialiseKeysFile([{ id: 'key_p', name: 'p', digest: `sha256:${tokenDigest(s.clientToken)}`, created: new Date().toISOString(), expires: null, revoked: null }]));

const up = await startUpstreamProcess(s, 5000);
const port = await freePort();
const upstream = `http://127.0.0.1:${up.port}`;
const child = spawn(process.execPath, ['--cpu-prof', `--cpu-prof-dir=${dir}`, '--max-semi-space-size=4', join(root, 'dist/main.js'), 'serve'], {
  env: {
    PATH: process.env.PATH ?? '',
    KEYWARD_PORT: String(port),
    KEYWARD_KEYS_FILE: keys,
    ...Object.assign({}, ...UPSTREAMS.map((spec) => providerEnv(spec, upstream, s.upstream[spec.name] ?? []))),
    ...(process.env.KEYWARD_WORKERS ? { KEYWARD_WORKERS: process.env.KEYWARD_WORKERS } : {}),
    ...(process.env.KEYWARD_LOG_LEVEL ? { KEYWARD_LOG_LEVEL: process.env.KEYWARD_LOG_LEVEL } : {}),
  },
  stdio: ['ignore', 'ignore', 'inherit'],
});
const base = `http://127.0.0.1:${port}`;
await waitReady(base, 10_000, child);
const auth = { authorization: `Bearer ${s.clientToken}` };
const load =
  scenario === 'stream'
    ? { url: `${base}/speech/v1/history/x/audio`, method: 'GET', headers: auth, connections: 8 }
    : scenario === 'latency'
      ? { url: `${base}/seo/v3/appendix/user_data`, method: 'GET', headers: auth, connections: 1 }
      : { url: `${base}/scraper/v2/acts/x/runs`, method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: '{}', connections: 64 };
// autocannon cannot keep up with 10 MiB bodies: stream with plain clients that discard.
const streamLoad = async (): Promise<{ '2xx': number; non2xx: number; errors: number }> => {
  const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
  let done = 0;
  const until = Date.now() + seconds * 1000;
  await Promise.all(
    Array.from({ length: 8 }, async () => {
      while (Date.now() < until) {
        await new Promise<void>((resolve) => http.get(load.url, { headers: auth, agent }, (res) => res.resume().on('end', () => (done++, resolve()))));
      }
    }),
  );
  agent.destroy();
  return { '2xx': done, non2xx: 0, errors: 0 };
};
const result = scenario === 'stream' ? await streamLoad() : await autocannon({ ...load, duration: seconds });
process.stderr.write(`${result['2xx']} requests, ${result.non2xx} non-2xx, ${result.errors} errors\n`);
child.kill('SIGTERM');
await new Promise((r) => child.once('exit', r));
await up.stop();

const file = readdirSync(dir).find((f) => f.endsWith('.cpuprofile'));
if (file === undefined) throw new Error('no profile written');
const profile = JSON.parse(readFileSync(join(dir, file), 'utf8')) as Profile;
const self = new Map<number, number>();
profile.samples.forEach((id, i) => self.set(id, (self.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0)));
const total = [...self.values()].reduce((a, b) => a + b, 0);
const byFn = new Map<string, number>();
const byModule = new Map<string, number>();
for (const n of profile.nodes) {
  const t = self.get(n.id) ?? 0;
  if (t === 0) continue;
  const url = n.callFrame.url.replace(`file://${root}`, '').replace(/^node:/, 'node:');
  const fn = `${n.callFrame.functionName || '(anonymous)'} ${url}:${n.callFrame.lineNumber + 1}`;
  byFn.set(fn, (byFn.get(fn) ?? 0) + t);
  const mod = url === '' ? n.callFrame.functionName : url.startsWith('/node_modules/') ? url.split('/').slice(0, 3).join('/') : url.startsWith('/src/') ? url : url.split('/')[0] ?? url;
  byModule.set(mod, (byModule.get(mod) ?? 0) + t);
}
const top = (m: Map<string, number>, n: number): string =>
  [...m.entries()]
    .sort((a, b) => b[1] - a[1])
    .slice(0, n)
    .map(([k, v]) => `${((100 * v) / total).toFixed(1).padStart(5)}%  ${k}`)
    .join('\n');
process.stdout.write(`profile: ${join(dir, file)}\nCPU per request: ${(total / result['2xx']).toFixed(1)} µs of samples\n\nby module:\n${top(byModule, 25)}\n\nby function:\n${top(byFn, 40)}\n`);

