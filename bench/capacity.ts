// The capacity row (docs/credentials.md, "Capacity"): a burst of 200
// requests on a route with two credentials whose accounts take 4 at once,
// through keyward with KEYWARD_SPEECH_CONCURRENCY=4 and through the same
// keyward without it. The upstream here counts requests in flight per
// credential and answers 429 past 4, as the voice provider does: with the
// option every request is answered 200 and the bound is never passed;
// without it the burst meets the provider's 429s.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { cpuUs, rssBytes, tree } from './proc.ts';
import { fmt, median, range } from './stats.ts';
import type { Ports, Secrets, System } from './systems.ts';

/** How many requests the burst sends at once, the accounts' capacity, and how long each answer takes, ms. */
export const BURST = 200;
export const ACCOUNT_CONCURRENCY = 4;
const HOLD_MS = 20;
const PATH = '/v1/text-to-speech/capacity';
/** Held by the upstream until the test lets go: what fills every account's room while requests wait. */
const HOLD_PATH = '/v1/text-to-speech/hold';
/** How many requests wait while their memory is measured. */
export const WAITING = 1000;

interface Counting {
  readonly port: number;
  /** Answer every request held on HOLD_PATH. */
  letGo(): void;
  /** The most in flight at once per credential since the last `reset`. */
  most(): number[];
  reset(): void;
  stop(): Promise<void>;
}

/** An upstream for the speech route that counts in flight per credential and refuses past the account's capacity. */
async function countingUpstream(keys: readonly string[]): Promise<Counting> {
  const now = keys.map(() => 0);
  let most = keys.map(() => 0);
  const held: http.ServerResponse[] = [];
  const server = http.createServer((req, res) => {
    const i = keys.indexOf(String(req.headers['xi-api-key']));
    if (i < 0) {
      res.writeHead(401).end();
      return;
    }
    now[i] = (now[i] as number) + 1;
    most[i] = Math.max(most[i] as number, now[i]);
    let over = false;
    const end = (): void => {
      if (over) return;
      over = true;
      now[i] = (now[i] as number) - 1;
    };
    res.on('close', end);
    req.resume();
    req.on('end', () => {
      if ((now[i] as number) > ACCOUNT_CONCURRENCY) {
        const body = '{"detail":{"status":"too_many_concurrent_requests"}}';
        res.writeHead(429, { 'content-type': 'application/json', 'content-length': body.length, 'retry-after': '1' }).end(body);
        return;
      }
      if (req.url?.endsWith(HOLD_PATH) === true) return void held.push(res);
      setTimeout(() => res.writeHead(200, { 'content-type': 'audio/mpeg', 'content-length': 4096 }).end(Buffer.alloc(4096, 7)), HOLD_MS);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    port: (server.address() as AddressInfo).port,
    most: () => [...most],
    letGo: () => {
      for (const res of held.splice(0)) res.writeHead(200, { 'content-length': 0 }).end();
    },
    reset: () => (most = keys.map(() => 0)),
    stop: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** One request on a connection of its own; resolves with its status (0: it failed). */
function send(sys: System, agent: http.Agent, path: string): Promise<number> {
  return new Promise<number>((resolve) => {
    const req = http.request(
      `${sys.base}${sys.prefix('speech')}${path}`,
      { method: 'POST', agent, headers: { ...sys.headers('speech'), 'content-type': 'application/json' }, timeout: 120_000 },
      (res) => {
        res.resume();
        res.on('end', () => resolve(res.statusCode ?? 0));
      },
    );
    req.on('error', () => resolve(0));
    req.end('{"text":"hello"}');
  });
}

/**
 * What WAITING requests cost while they wait: every account's room taken
 * by requests the upstream holds, then WAITING more, each on a connection
 * of its own; the gateway's resident memory before and after they are all
 * in the queue (read from its readiness), MB.
 */
async function waitingMemory(sys: System, up: Counting, admin: string): Promise<{ mb: number; queued: number }> {
  const agent = new http.Agent({ keepAlive: false, maxSockets: Infinity });
  const pid = sys.pid as number;
  const slots = 2 * ACCOUNT_CONCURRENCY;
  const holding = Array.from({ length: slots }, () => send(sys, agent, HOLD_PATH));
  const queued = async (): Promise<number> => {
    const r = (await (await fetch(`${admin}/readyz`)).json()) as { capacity?: { speech?: { queued: number; inFlight: number } } };
    return r.capacity?.speech?.queued ?? 0;
  };
  const until = async (ok: () => Promise<boolean>): Promise<void> => {
    for (let i = 0; i < 600 && !(await ok()); i++) await new Promise((r) => setTimeout(r, 100));
  };
  await until(
    async () => ((await (await fetch(`${admin}/readyz`)).json()) as { capacity?: { speech?: { inFlight: number } } }).capacity?.speech?.inFlight === slots,
  );
  const before = rssBytes(tree(pid));
  const waiting = Array.from({ length: WAITING }, () => send(sys, agent, PATH));
  await until(async () => (await queued()) >= WAITING);
  const n = await queued();
  const after = rssBytes(tree(pid));
  up.letGo();
  await Promise.all([...holding, ...waiting]);
  agent.destroy();
  return { mb: (after - before) / 1024 / 1024, queued: n };
}

interface Burst {
  readonly statuses: Map<number, number>;
  readonly most: number[];
  readonly ms: number;
  readonly cpuUsPerReq: number;
}

/** BURST requests at once, each on a connection of its own, and what came back. */
async function burst(sys: System, up: Counting): Promise<Burst> {
  up.reset();
  const agent = new http.Agent({ keepAlive: false, maxSockets: BURST });
  const pids = sys.pid === null ? [] : tree(sys.pid);
  const cpu0 = cpuUs(pids);
  const started = performance.now();
  const statuses = new Map<number, number>();
  await Promise.all(
    Array.from(
      { length: BURST },
      () =>
        new Promise<void>((resolve) => {
          const req = http.request(
            `${sys.base}${sys.prefix('speech')}${PATH}`,
            { method: 'POST', agent, headers: { ...sys.headers('speech'), 'content-type': 'application/json' }, timeout: 60_000 },
            (res) => {
              res.resume();
              res.on('end', () => {
                statuses.set(res.statusCode ?? 0, (statuses.get(res.statusCode ?? 0) ?? 0) + 1);
                resolve();
              });
            },
          );
          req.on('error', () => {
            statuses.set(0, (statuses.get(0) ?? 0) + 1);
            resolve();
          });
          req.end('{"text":"hello"}');
        }),
    ),
  );
  const ms = performance.now() - started;
  agent.destroy();
  return { statuses, most: up.most(), ms, cpuUsPerReq: (cpuUs(pids) - cpu0) / BURST };
}

/**
 * The row: keyward with the option and without it, `rounds` bursts each,
 * interleaved. `start` starts a keyward on `ports` with extra environment.
 * Returns the report's lines and the budgets it holds.
 */
export async function capacityRows(
  start: (ports: Ports, name: string, env: Record<string, string>) => Promise<System>,
  ports: Ports,
  secrets: Secrets,
  rounds: number,
  log: (line: string) => void,
): Promise<{ lines: string[]; budgets: Array<[string, number, number, '<=' | '>=', string]> }> {
  const keys = [secrets.upstream.speech?.[0] ?? '', secrets.more.speech?.[0]?.[0] ?? ''];
  const up = await countingUpstream(keys);
  const routed: Ports = typeof ports === 'number' ? { scraper: ports, seo: ports, speech: up.port } : { ...ports, speech: up.port };
  const two = { KEYWARD_SPEECH_KEY_2: keys[1] as string };
  const systems = [
    await start(routed, `keyward, KEYWARD_SPEECH_CONCURRENCY=${ACCOUNT_CONCURRENCY}`, { ...two, KEYWARD_SPEECH_CONCURRENCY: String(ACCOUNT_CONCURRENCY) }),
    await start(routed, 'keyward, no capacity option', two),
  ];
  const results = new Map<string, Burst[]>();
  let memory: { mb: number; queued: number } | null = null;
  try {
    for (let round = -1; round < rounds; round++) {
      for (const sys of round % 2 === 0 ? systems : [...systems].reverse()) {
        const b = await burst(sys, up);
        if (round >= 0) results.set(sys.name, [...(results.get(sys.name) ?? []), b]);
        const codes = [...b.statuses].map(([s, n]) => `${n}×${s}`).join(' ');
        log(
          `capacity ${round < 0 ? 'warm-up' : `round ${round + 1}/${rounds}`} ${sys.name.padEnd(40)} ${codes}, most in flight ${b.most.join('/')}, ${fmt(b.ms, 0)} ms`,
        );
      }
    }
    const admin = systems[0]?.admin;
    if (admin !== undefined) memory = await waitingMemory(systems[0] as System, up, admin);
  } finally {
    await Promise.all(systems.map((s) => s.stop()));
    await up.stop();
  }
  const lines = [
    `## capacity: a burst of ${BURST} on 2 credentials whose accounts take ${ACCOUNT_CONCURRENCY} at once`,
    '',
    `Each request on a connection of its own; the upstream holds each ${HOLD_MS} ms and answers 429 past ${ACCOUNT_CONCURRENCY} in flight on a credential, as the voice provider does. Medians over ${rounds} interleaved rounds.`,
    '',
    '| system | answered 200 | 429 | 503 | other | most in flight on a credential, any round | burst answered in ms | CPU µs/req |',
    '|---|---:|---:|---:|---:|---:|---:|---:|',
  ];
  const budgets: Array<[string, number, number, '<=' | '>=', string]> = [];
  for (const sys of systems) {
    const rs = results.get(sys.name) ?? [];
    const count = (s: number): number => median(rs.map((r) => r.statuses.get(s) ?? 0)) ?? NaN;
    const other = median(rs.map((r) => [...r.statuses].filter(([s]) => s !== 200 && s !== 429 && s !== 503).reduce((n, [, c]) => n + c, 0))) ?? NaN;
    const most = Math.max(...rs.flatMap((r) => r.most));
    lines.push(
      `| ${sys.name} | ${fmt(count(200), 0)} | ${fmt(count(429), 0)} | ${fmt(count(503), 0)} | ${fmt(other, 0)} | ${most} | ${fmt(median(rs.map((r) => r.ms)), 0)} (${range(
        rs.map((r) => r.ms),
        0,
      )}) | ${fmt(median(rs.map((r) => r.cpuUsPerReq)), 0)} |`,
    );
    if (sys === systems[0]) {
      budgets.push([
        `capacity: a burst of ${BURST}, requests answered 200 (every round)`,
        Math.min(...rs.map((r) => r.statuses.get(200) ?? 0)),
        BURST,
        '>=',
        '',
      ]);
      budgets.push(['capacity: 429s the burst met (every round)', Math.max(...rs.map((r) => r.statuses.get(429) ?? 0)), 0, '<=', '']);
      budgets.push(['capacity: most requests in flight on one credential', most, ACCOUNT_CONCURRENCY, '<=', '']);
    }
  }
  if (memory !== null) {
    lines.push(
      '',
      `${memory.queued.toLocaleString('en')} requests waiting (every account's room held by requests the upstream keeps, each waiting request on a connection of its own, its body unread): the gateway's resident memory grew by **${fmt(memory.mb, 1)} MB**, ${fmt((memory.mb * 1024) / Math.max(1, memory.queued), 1)} KiB per waiting request (its socket, parser, request and response objects, and its place in the queue).`,
    );
    budgets.push([`capacity: resident memory of ${WAITING.toLocaleString('en')} waiting requests`, memory.mb, 64, '<=', ' MB']);
  }
  lines.push('');
  return { lines, budgets };
}
