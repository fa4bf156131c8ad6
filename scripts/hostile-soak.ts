// Hostile-upstream soak: a real gateway process (bin/keyward serve) whose
// speech upstream answers every request either honestly or with one of the
// bodies built to get a secret past the egress filter or to make the gateway
// work (docs/security.md), mixed, for a bounded time, then each kind alone
// for a moment. Every byte each client receives is checked for every
// secret: as it arrived, decoded by every coding whatever the labels, and
// with every escape undone (after the traffic, so the checks' own work
// never slows the traffic or the honest client). An honest client, in a
// thread of its own so that nothing here delays it, measures its latency
// before, during and after the mix and during each kind alone; the
// gateway's longest event-loop stall in each phase is read from its
// metrics. Reports which hostile kinds cost the honest client most, and the
// gateway's RSS and CPU after the traffic stops. Exits 1 on any secret at a
// client, the honest p99 during the mix over 3× its p99 before, CPU or RSS
// not back to baseline within 10 s, or an upstream socket left open.
//   scripts/hostile-soak [--seconds 30] [--rate 40]
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import { freePort } from '../src/process/listen.ts';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';
import { Worker } from 'node:worker_threads';
import http from 'node:http';
import zlib from 'node:zlib';
import { secretForm, Secrets, BodyScan } from '../src/request/egress.ts';
import { providerEnv, UPSTREAMS } from '../src/request/routes.ts';
import { base64Middles } from '../src/request/spellings.ts';

const { values: args } = parseArgs({ options: { seconds: { type: 'string', default: '30' }, rate: { type: 'string', default: '40' } } });
const SECONDS = Number(args.seconds);
const RATE = Number(args.rate);
if (!(SECONDS >= 5 && SECONDS <= 3600) || !(RATE >= 1 && RATE <= 500)) {
  console.error('hostile-soak: --seconds must be 5–3600 and --rate 1–500');
  process.exit(2);
}
const BIN = fileURLToPath(new URL('../bin/keyward', import.meta.url));
const exec = promisify(execFile);
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

const secrets = Object.fromEntries(UPSTREAMS.map((spec) => [spec.name, spec.sampleSecrets(`hs${randomBytes(8).toString('hex')}`)]));
const key = (secrets.speech as readonly string[])[0] as string;
const [login, password] = secrets.seo as readonly [string, string];
const basic = Buffer.from(`${login}:${password}`).toString('base64');
const values = UPSTREAMS.flatMap((spec) => spec.secretForms(secrets[spec.name] ?? []).map((f) => f.value));
// The checker: the gateway's own matcher over what arrived, decoded every way (the property tests check the matcher itself).
const checker = new Secrets(values.flatMap((v) => [secretForm('x', 'v', v), ...base64Middles(v).map((b) => secretForm('x', 'b64', b))]));
const leaks = (bytes: Buffer): boolean => {
  const scan = new BodyScan(checker);
  scan.push(bytes);
  scan.end();
  return scan.found !== null;
};

// ---- the hostile bodies (docs/security.md; issue numbers of the hardening round) ----
const json = Buffer.from(`{"xi_api_key":"${key}","subscription":{"tier":"creator"}}`);
const gzipHeaderField = (field: string, body: Buffer): Buffer => {
  const plain = zlib.gzipSync(body);
  const head = Buffer.from(plain.subarray(0, 10));
  head[3] = 0x08;
  return Buffer.concat([head, Buffer.from(`${field}\0`), plain.subarray(10)]);
};
const head = (status: string, headers: string, length: number | null): string =>
  `HTTP/1.1 ${status}\r\ncontent-type: application/json\r\n${headers}${length === null ? '' : `content-length: ${length}\r\n`}connection: close\r\n\r\n`;
const whole = (body: Buffer, headers = '', status = '200 OK'): Buffer[] => [Buffer.concat([Buffer.from(head(status, headers, body.length)), body])];
const zstdJson = zlib.zstdCompressSync(json);
const at = zstdJson.indexOf(Buffer.from(key)) + key.length;
const bombBr = zlib.brotliCompressSync(Buffer.alloc(512 * 1024 * 1024), { params: { [zlib.constants.BROTLI_PARAM_QUALITY]: 1 } });
const bombGz = zlib.gzipSync(Buffer.alloc(128 * 1024 * 1024), { level: 9 });
const held = zlib.gzipSync(Buffer.alloc(8 * 1024 * 1024, 'a'), { level: 0 });
const HOSTILE: ReadonlyArray<[string, () => Buffer[]]> = [
  ['2 trailing bytes', () => whole(Buffer.concat([zlib.deflateSync('hello '), Buffer.from(key)]), 'content-encoding: deflate\r\n')],
  ['2 gzip, zeros, key', () => whole(Buffer.concat([zlib.gzipSync('hello'), Buffer.alloc(10), Buffer.from(key)]), 'content-encoding: gzip\r\n')],
  ['3 reason phrase', () => whole(Buffer.from('{}'), '', `200 ${key}`)],
  ['4 percent-encoded', () => whole(Buffer.from([...key].map((c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`).join('')))],
  ['4 json \\u', () => whole(Buffer.from(`"${key.replace(/_/g, '\\u005f')}"`))],
  ['4 password case', () => whole(Buffer.from(password.toUpperCase()))],
  ['4 basic %3D', () => whole(Buffer.from(basic.replace(/=/g, '%3D')))],
  ['5 zstd split', () => [Buffer.from(head('200 OK', 'content-encoding: zstd\r\n', zstdJson.length)), zstdJson.subarray(0, at), zstdJson.subarray(at)]],
  ['6 gzip FNAME', () => whole(gzipHeaderField(key, Buffer.from('{}')), 'content-encoding: gzip\r\n')],
  ['7 \\/ basic', () => whole(Buffer.from(`{"auth":"${basic.replace(/\//g, '\\/')}"}`))],
  ['7 base64 cookie', () => whole(Buffer.from('{}'), `set-cookie: s=${Buffer.from(`{"k":"${key}"}`).toString('base64')}\r\n`)],
  ['7 utf-16', () => whole(Buffer.from(key, 'utf16le'))],
  ['7 html entity', () => whole(Buffer.from([...key].map((c) => `&#${c.charCodeAt(0)};`).join('')))],
  ['8 gzip as identity', () => whole(zlib.gzipSync(json), 'content-encoding: identity\r\n')],
  ['8 gzip unlabelled', () => whole(zlib.gzipSync(json))],
  [
    '8 transfer gzip',
    () => [
      Buffer.from(head('200 OK', 'transfer-encoding: gzip, chunked\r\n', null)),
      Buffer.from(`${zlib.gzipSync(json).length.toString(16)}\r\n`),
      zlib.gzipSync(json),
      Buffer.from('\r\n0\r\n\r\n'),
    ],
  ],
  ['9 stacked codings', () => whole(zlib.gzipSync(json), `content-encoding: ${Array(3000).fill('gzip').join(',')}\r\n`)],
  ['10 held body', () => whole(held, 'content-encoding: gzip\r\n')],
  ['11 brotli bomb', () => whole(bombBr, 'content-encoding: br\r\n')],
  ['11 gzip bomb', () => whole(bombGz, 'content-encoding: gzip\r\n')],
  ['12 undecodable', () => whole(Buffer.from('plain bytes, not gzip'), 'content-encoding: gzip\r\n')],
  [
    '12b stray bytes',
    () => [Buffer.concat([Buffer.from(head('200 OK', '', json.length)), Buffer.from('{"ok":true}'.padEnd(json.length)), Buffer.from(`STRAY ${key}\r\n\r\n`)])],
  ],
];
const honest = Buffer.from(JSON.stringify({ voices: Array.from({ length: 40 }, (_, i) => ({ voice_id: `v${i}`, name: `Voice ${i}` })) }));
const honestGz = zlib.gzipSync(honest);

async function main(): Promise<number> {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-hostile-'));
  // ---- the upstream: raw TCP, so it can send what no HTTP server would ----
  const sockets = new Set<net.Socket>();
  const upstream = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => socket.destroy());
    socket.once('data', (d: Buffer) => void answer(d).catch(() => socket.destroy()));
    const answer = async (d: Buffer): Promise<void> => {
      const path = /^[A-Z]+ (\S+)/.exec(d.toString('latin1'))?.[1] ?? '';
      const n = /\/hostile\/(\d+)/.exec(path)?.[1];
      const parts =
        n === undefined
          ? path.includes('gz')
            ? whole(honestGz, 'content-encoding: gzip\r\n')
            : whole(honest)
          : (HOSTILE[Number(n)] as (typeof HOSTILE)[number])[1]();
      for (const [i, p] of parts.entries()) {
        if (socket.destroyed) return;
        socket.write(p);
        if (i < parts.length - 1) await sleep(5);
      }
      socket.end();
    };
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  const adminPort = await freePort();
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '',
    KEYWARD_PORT: '0',
    KEYWARD_ADMIN_PORT: String(adminPort),
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_LOG_LEVEL: 'warn',
    ...Object.assign({}, ...UPSTREAMS.map((spec) => providerEnv(spec, url, secrets[spec.name] ?? []))),
  };
  const token = (JSON.parse((await exec(BIN, ['keys', 'create', '--name', 'soak', '--json'], { env })).stdout) as { token: string }).token;
  env.KEYWARD_LOG_LEVEL = 'info';
  const gateway = spawn(BIN, ['serve'], { env, stdio: ['ignore', 'pipe', 'inherit'] });
  let tail = '';
  let secretInLogs = false;
  const port = await new Promise<number>((resolve, reject) => {
    gateway.stdout.setEncoding('utf8').on('data', (d: string) => {
      const lines = (tail + d).split('\n');
      tail = lines.pop() ?? '';
      for (const l of lines) {
        if (values.some((v) => l.includes(v))) secretInLogs = true;
        if (l.includes('"msg":"keyward listening"')) resolve((JSON.parse(l) as { port: number }).port);
      }
    });
    gateway.on('exit', (code) => reject(new Error(`gateway exited (${code})`)));
  });
  const pid = gateway.pid as number;
  const stat = (): { cpuMs: number; rssMb: number } => {
    const f = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]?.split(' ') ?? [];
    return {
      cpuMs: ((Number(f[11]) + Number(f[12])) * 1000) / 100,
      rssMb: Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) / 1024,
    };
  };

  /** One request on its own connection; every byte that came back. */
  const get = (path: string): Promise<{ bytes: Buffer; ms: number }> =>
    new Promise((resolve) => {
      const start = performance.now();
      const out: Buffer[] = [];
      const s = net.connect(port, '127.0.0.1', () =>
        s.write(`GET /speech${path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\naccept-encoding: gzip, br, zstd\r\nconnection: close\r\n\r\n`),
      );
      const timer = setTimeout(() => s.destroy(), 20_000);
      s.on('data', (d: Buffer) => out.push(d));
      s.on('close', () => {
        clearTimeout(timer);
        resolve({ bytes: Buffer.concat(out), ms: performance.now() - start });
      });
      s.on('error', () => undefined);
    });
  /**
   * The honest client: in a thread of its own, so that what this thread
   * does (sending the hostile mix) never delays it. It requests a gzip
   * voice list, one after another, and keeps each latency under the phase
   * it is told; at the end it hands back every latency and every answer.
   */
  const honestClient = new Worker(
    `const { parentPort, workerData } = require('node:worker_threads');
     const net = require('node:net');
     let phase = 'idle', stopped = false;
     const samples = {}, answers = [];
     parentPort.on('message', (m) => { if (m === 'stop') stopped = true; else phase = m; });
     const get = () => new Promise((resolve) => {
       const start = performance.now(), out = [];
       const s = net.connect(workerData.port, '127.0.0.1', () => s.write('GET /speech/v1/voices/gz HTTP/1.1\\r\\nhost: x\\r\\nauthorization: Bearer ' + workerData.token + '\\r\\naccept-encoding: gzip\\r\\nconnection: close\\r\\n\\r\\n'));
       const timer = setTimeout(() => s.destroy(), 20000);
       s.on('data', (d) => out.push(d));
       s.on('close', () => { clearTimeout(timer); resolve({ bytes: Buffer.concat(out), ms: performance.now() - start }); });
       s.on('error', () => undefined);
     });
     (async () => {
       while (!stopped) {
         const at = phase;
         if (at === 'idle') { await new Promise((w) => setTimeout(w, 10)); continue; }
         const r = await get();
         (samples[at] ??= []).push(r.ms);
         if (answers.length < 2000) answers.push(r.bytes);
       }
       parentPort.postMessage({ samples, answers });
     })();`,
    { eval: true, workerData: { port, token } },
  );
  const honestDone = new Promise<{ samples: Record<string, number[]>; answers: Uint8Array[] }>((resolve) => honestClient.once('message', resolve));
  /** The gateway's longest event-loop stall since the last call (prom-client's histogram, reset at each scrape), ms. */
  const stall = (): Promise<number> =>
    new Promise((resolve) => {
      http
        .get(`http://127.0.0.1:${adminPort}/metrics`, (res) => {
          let t = '';
          res.setEncoding('utf8').on('data', (d: string) => (t += d));
          res.on('end', () => resolve(Number(/^nodejs_eventloop_lag_max_seconds (\S+)$/m.exec(t)?.[1] ?? NaN) * 1000));
        })
        .on('error', () => resolve(NaN));
    });
  /** What arrived, as it came and decoded every way a client might (whatever the labels). */
  const views = (bytes: Buffer): Buffer[] => {
    const body = bytes.subarray(bytes.indexOf('\r\n\r\n') + 4);
    const flush = { finishFlush: zlib.constants.Z_SYNC_FLUSH };
    const decoders: Array<(b: Buffer) => Buffer> = [
      (b) => zlib.gunzipSync(b, flush),
      (b) => zlib.inflateSync(b, flush),
      (b) => zlib.inflateRawSync(b, flush),
      (b) => zlib.brotliDecompressSync(b),
      (b) => zlib.zstdDecompressSync(b),
    ];
    const decoded = decoders.map((f) => {
      try {
        return f(body);
      } catch {
        return Buffer.alloc(0);
      }
    });
    return [bytes, ...decoded];
  };
  let leaked: string[] = [];
  const outcomes = new Map<string, Map<string, number>>();
  /** Answers kept for the check after the traffic (checking here would slow the traffic down). */
  const received: Array<[string, Buffer]> = [];
  const record = (name: string, bytes: Buffer): void => {
    received.push([name, bytes]);
    const status = /^HTTP\/1\.1 (\d+)/.exec(bytes.toString('latin1'))?.[1] ?? 'cut';
    const m = outcomes.get(name) ?? new Map<string, number>();
    m.set(status, (m.get(status) ?? 0) + 1);
    outcomes.set(name, m);
  };
  const p99 = (xs: number[] | undefined): number => [...(xs ?? [])].sort((a, b) => a - b)[Math.floor((xs ?? []).length * 0.99)] ?? NaN;
  const stalls = new Map<string, number>();
  /** One phase of `seconds`: the honest client told its name, and `kinds` (hostile indexes, or 'honest') sent at RATE. */
  const phase = async (name: string, seconds: number, kinds: ReadonlyArray<number | 'honest'>): Promise<number> => {
    await stall();
    honestClient.postMessage(name);
    const pending = new Set<Promise<void>>();
    const end = Date.now() + seconds * 1000;
    let sent = 0;
    while (Date.now() < end) {
      if (kinds.length > 0) {
        const k = kinds[sent++ % kinds.length] as number | 'honest';
        const path = k === 'honest' ? '/v1/voices' : `/v1/hostile/${k}`;
        const label = k === 'honest' ? 'honest' : (HOSTILE[k] as (typeof HOSTILE)[number])[0];
        const p = get(path).then((r) => record(label, r.bytes));
        pending.add(p);
        void p.finally(() => pending.delete(p));
        await sleep(1000 / RATE);
      } else await sleep(50);
    }
    honestClient.postMessage('idle');
    await Promise.all(pending);
    stalls.set(name, await stall());
    return sent;
  };
  await sleep(300);
  await phase('before', 3, []);
  const idle = stat();
  // ---- the mix, then each kind alone ----
  const mix = [...HOSTILE.keys(), 'honest', 'honest', 'honest', 'honest'] as const;
  const sent = await phase('during', SECONDS, mix);
  const alone = Math.max(1, Math.min(3, SECONDS / HOSTILE.length));
  for (const [i, [name]] of HOSTILE.entries()) await phase(name, alone, [i]);
  // ---- back to baseline ----
  const stopped = Date.now();
  let settled = -1;
  let last = stat();
  while (Date.now() - stopped < 10_000) {
    await sleep(1000);
    const now = stat();
    const cpu = (now.cpuMs - last.cpuMs) / 1000;
    last = now;
    console.log(
      `  +${((Date.now() - stopped) / 1000).toFixed(0)} s: CPU ${(cpu * 100).toFixed(0)} %, RSS ${now.rssMb.toFixed(0)} MB, upstream sockets ${sockets.size}`,
    );
    if (cpu < 0.05 && now.rssMb < idle.rssMb + 64 && sockets.size === 0) {
      settled = (Date.now() - stopped) / 1000;
      break;
    }
  }
  await phase('after', 3, []);
  honestClient.postMessage('stop');
  const { samples, answers } = await honestDone;
  await honestClient.terminate();
  for (const a of answers) record('honest', Buffer.from(a));
  // ---- every byte each client received, checked ----
  for (const [name, bytes] of received) if (views(bytes).some(leaks)) leaked.push(name);
  const final = stat();
  gateway.kill('SIGTERM');
  await new Promise((r) => gateway.once('exit', r));
  upstream.close();
  rmSync(dir, { recursive: true, force: true });

  leaked = [...new Set(leaked)];
  const before = p99(samples.before);
  const during = p99(samples.during);
  console.log(
    `hostile soak: ${SECONDS} s, ${sent} requests in the mix (${HOSTILE.length} hostile kinds, ${RATE}/s) beside an honest client, then each kind alone for ${alone.toFixed(1)} s`,
  );
  for (const [name, m] of outcomes) console.log(`  ${name.padEnd(22)} ${[...m].map(([st, n]) => `${st}×${n}`).join(' ')}`);
  console.log(
    `  honest client p99: before ${before.toFixed(1)} ms, during ${during.toFixed(1)} ms (${(during / before).toFixed(1)}×), after ${p99(samples.after).toFixed(1)} ms`,
  );
  console.log(
    `  gateway's longest event-loop stall: before ${stalls.get('before')?.toFixed(1)} ms, during ${stalls.get('during')?.toFixed(1)} ms, after ${stalls.get('after')?.toFixed(1)} ms`,
  );
  console.log('  what each kind alone costs the honest client (p99 while only it is sent), and the longest stall, most costly first:');
  const costs = HOSTILE.map(([name]) => ({ name, p99: p99(samples[name]), stall: stalls.get(name) ?? NaN })).sort((a, b) => b.p99 - a.p99);
  for (const c of costs)
    console.log(`    ${c.name.padEnd(22)} p99 ${c.p99.toFixed(1).padStart(7)} ms (${(c.p99 / before).toFixed(1)}×)   longest stall ${c.stall.toFixed(1)} ms`);
  console.log(
    `  gateway: idle RSS ${idle.rssMb.toFixed(0)} MB; back to baseline (CPU < 5 %, RSS < idle + 64 MB, no upstream socket open) ${settled < 0 ? 'NOT within 10 s' : `after ${settled} s`}; final RSS ${final.rssMb.toFixed(0)} MB`,
  );
  console.log(
    `  secret bytes at a client: ${leaked.length === 0 ? 'none' : leaked.join(', ')}; in the logs: ${secretInLogs ? 'YES' : 'none'}; upstream sockets open: ${sockets.size}`,
  );
  const tailOk = during <= 3 * before;
  if (!tailOk) console.log(`  honest p99 during the mix is ${(during / before).toFixed(1)}× its p99 before (at most 3×)`);
  const ok = leaked.length === 0 && !secretInLogs && settled >= 0 && tailOk;
  console.log(ok ? 'PASS' : 'FAIL');
  return ok ? 0 : 1;
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    console.error(err);
    process.exit(1);
  },
);
