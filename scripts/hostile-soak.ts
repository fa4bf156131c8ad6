// Hostile-upstream soak: a real gateway process (bin/keyward serve) whose
// speech upstream answers every request either honestly or with one of the
// bodies built to get a secret past the egress filter or to make the gateway
// work (docs/security.md), mixed, for a bounded time. Every byte each client
// receives is checked for every secret: as it arrived, decoded by every
// coding whatever the labels, and with every escape undone. Reports an
// honest client's latency before, during and after, and the gateway's RSS
// and CPU after the traffic stops. Exits 1 on any secret at a client, CPU
// or RSS not back to baseline within 10 s, or an upstream socket left open.
//   scripts/hostile-soak [--seconds 30] [--rate 40]
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs, promisify } from 'node:util';
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
  ['8 transfer gzip', () => [Buffer.from(head('200 OK', 'transfer-encoding: gzip, chunked\r\n', null)), Buffer.from(`${zlib.gzipSync(json).length.toString(16)}\r\n`), zlib.gzipSync(json), Buffer.from('\r\n0\r\n\r\n')]],
  ['9 stacked codings', () => whole(zlib.gzipSync(json), `content-encoding: ${Array(3000).fill('gzip').join(',')}\r\n`)],
  ['10 held body', () => whole(held, 'content-encoding: gzip\r\n')],
  ['11 brotli bomb', () => whole(bombBr, 'content-encoding: br\r\n')],
  ['11 gzip bomb', () => whole(bombGz, 'content-encoding: gzip\r\n')],
  ['12 undecodable', () => whole(Buffer.from('plain bytes, not gzip'), 'content-encoding: gzip\r\n')],
  ['12b stray bytes', () => [Buffer.concat([Buffer.from(head('200 OK', '', json.length)), Buffer.from('{"ok":true}'.padEnd(json.length)), Buffer.from(`STRAY ${key}\r\n\r\n`)])]],
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
    socket.once('data', async (d: Buffer) => {
      const path = /^[A-Z]+ (\S+)/.exec(d.toString('latin1'))?.[1] ?? '';
      const n = /\/hostile\/(\d+)/.exec(path)?.[1];
      const parts = n === undefined ? (path.includes('gz') ? whole(honestGz, 'content-encoding: gzip\r\n') : whole(honest)) : (HOSTILE[Number(n)] as (typeof HOSTILE)[number])[1]();
      for (const [i, p] of parts.entries()) {
        if (socket.destroyed) return;
        socket.write(p);
        if (i < parts.length - 1) await sleep(5);
      }
      socket.end();
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', r));
  const url = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  const env: Record<string, string> = {
    PATH: process.env.PATH ?? '',
    HOME: process.env.HOME ?? '',
    KEYWARD_PORT: '0',
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
    return { cpuMs: ((Number(f[11]) + Number(f[12])) * 1000) / 100, rssMb: Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1]) / 1024 };
  };

  /** One request on its own connection; every byte that came back. */
  const get = (path: string): Promise<{ bytes: Buffer; ms: number }> =>
    new Promise((resolve) => {
      const start = performance.now();
      const out: Buffer[] = [];
      const s = net.connect(port, '127.0.0.1', () => s.write(`GET /speech${path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\naccept-encoding: gzip, br, zstd\r\nconnection: close\r\n\r\n`));
      const timer = setTimeout(() => s.destroy(), 20_000);
      s.on('data', (d: Buffer) => out.push(d));
      s.on('close', () => {
        clearTimeout(timer);
        resolve({ bytes: Buffer.concat(out), ms: performance.now() - start });
      });
      s.on('error', () => undefined);
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
  const record = (name: string, bytes: Buffer): void => {
    if (views(bytes).some(leaks)) leaked.push(name);
    const status = /^HTTP\/1\.1 (\d+)/.exec(bytes.toString('latin1'))?.[1] ?? 'cut';
    const m = outcomes.get(name) ?? new Map<string, number>();
    m.set(status, (m.get(status) ?? 0) + 1);
    outcomes.set(name, m);
  };
  const p99 = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length * 0.99)] ?? NaN;
  /** An honest client alone for `seconds`: its latencies. */
  const honestOnly = async (seconds: number): Promise<number[]> => {
    const ms: number[] = [];
    const end = Date.now() + seconds * 1000;
    while (Date.now() < end) {
      const r = await get('/v1/voices/gz');
      record('honest', r.bytes);
      ms.push(r.ms);
    }
    return ms;
  };
  await sleep(300);
  const before = await honestOnly(3);
  const idle = stat();
  // ---- the mix ----
  const during: number[] = [];
  const pending = new Set<Promise<void>>();
  const end = Date.now() + SECONDS * 1000;
  let sent = 0;
  const honestLoop = (async (): Promise<void> => {
    while (Date.now() < end) {
      const r = await get('/v1/voices/gz');
      record('honest', r.bytes);
      during.push(r.ms);
    }
  })();
  while (Date.now() < end) {
    const i = sent++ % (HOSTILE.length + 4);
    const path = i < HOSTILE.length ? `/v1/hostile/${i}` : '/v1/voices';
    const name = i < HOSTILE.length ? (HOSTILE[i] as (typeof HOSTILE)[number])[0] : 'honest';
    const p = get(path).then((r) => record(name, r.bytes));
    pending.add(p);
    void p.finally(() => pending.delete(p));
    await sleep(1000 / RATE);
  }
  await honestLoop;
  await Promise.all(pending);
  // ---- back to baseline ----
  const stopped = Date.now();
  let settled = -1;
  let last = stat();
  while (Date.now() - stopped < 10_000) {
    await sleep(1000);
    const now = stat();
    const cpu = (now.cpuMs - last.cpuMs) / 1000;
    last = now;
    console.log(`  +${((Date.now() - stopped) / 1000).toFixed(0)} s: CPU ${(cpu * 100).toFixed(0)} %, RSS ${now.rssMb.toFixed(0)} MB, upstream sockets ${sockets.size}`);
    if (cpu < 0.05 && now.rssMb < idle.rssMb + 64 && sockets.size === 0) {
      settled = (Date.now() - stopped) / 1000;
      break;
    }
  }
  const after = await honestOnly(3);
  const final = stat();
  gateway.kill('SIGTERM');
  await new Promise((r) => gateway.once('exit', r));
  upstream.close();
  rmSync(dir, { recursive: true, force: true });

  leaked = [...new Set(leaked)];
  console.log(`hostile soak: ${SECONDS} s, ${sent} requests in the mix (${HOSTILE.length} hostile kinds, ${RATE}/s) beside an honest client`);
  for (const [name, m] of outcomes) console.log(`  ${name.padEnd(22)} ${[...m].map(([s, n]) => `${s}×${n}`).join(' ')}`);
  console.log(`  honest client p99: before ${p99(before).toFixed(1)} ms, during ${p99(during).toFixed(1)} ms, after ${p99(after).toFixed(1)} ms`);
  console.log(`  gateway: idle RSS ${idle.rssMb.toFixed(0)} MB; back to baseline (CPU < 5 %, RSS < idle + 64 MB, no upstream socket open) ${settled < 0 ? 'NOT within 10 s' : `after ${settled} s`}; final RSS ${final.rssMb.toFixed(0)} MB`);
  console.log(`  secret bytes at a client: ${leaked.length === 0 ? 'none' : leaked.join(', ')}; in the logs: ${secretInLogs ? 'YES' : 'none'}; upstream sockets open: ${sockets.size}`);
  const ok = leaked.length === 0 && !secretInLogs && settled >= 0;
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
