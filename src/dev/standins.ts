// Local stand-ins for the upstreams, for `keyward demo` and the tests: one
// per provider of the table (routes.ts). Each refuses any request that lacks
// the credential the gateway is meant to inject, which is what the demo
// shows, and answers its provider's example requests: with realistic bodies
// for the three providers keyward ships, with a small JSON echo for any other.
import { randomBytes, timingSafeEqual } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { UpstreamSpec } from '../request/routes.ts';

export interface Standins {
  /** Route name → the stand-in's base URL. */
  readonly urls: Readonly<Record<string, string>>;
  close(): Promise<void>;
}

type Handler = (req: IncomingMessage, res: ServerResponse, body: Buffer, path: string) => void;

function json(res: ServerResponse, status: number, value: unknown): void {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

function same(a: string | string[] | undefined, b: string): boolean {
  const x = Buffer.from(typeof a === 'string' ? a : '');
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/** Bytes shaped like an MPEG audio stream: frame headers (0xFFFB) and noise. */
function fakeMp3(bytes: number): Buffer {
  const buf = randomBytes(bytes);
  for (let i = 0; i + 1 < bytes; i += 418) {
    buf[i] = 0xff;
    buf[i + 1] = 0xfb;
  }
  return buf;
}

/** What a stand-in run costs once it ended, USD (at most its `maxTotalChargeUsd`), and how long it runs. */
export const STANDIN_RUN = { usd: 0.3, ms: 3_000 } as const;

/**
 * The scraper platform's runs: a run-start answers a run object (`READY`);
 * `GET /v2/actor-runs/{id}` answers it `RUNNING` for a few seconds, then
 * `SUCCEEDED` with its `usageTotalUsd` (capped by the start's
 * `maxTotalChargeUsd`, as the platform caps a pay-per-event run).
 */
function scraperStandin(): Handler {
  const runs = new Map<string, { actId: string; started: number; cap: number }>();
  const object = (id: string, r: { actId: string; started: number; cap: number }): object => {
    const done = Date.now() - r.started >= STANDIN_RUN.ms;
    return {
      data: {
        id,
        actId: r.actId,
        status: done ? 'SUCCEEDED' : 'RUNNING',
        startedAt: new Date(r.started).toISOString(),
        ...(done ? { finishedAt: new Date(r.started + STANDIN_RUN.ms).toISOString() } : {}),
        usageTotalUsd: done ? Math.min(STANDIN_RUN.usd, r.cap) : 0,
      },
    };
  };
  return (req, res, _body, path) => {
    const run = /^\/v2\/acts\/([^/]+)\/runs$/.exec(path);
    if (req.method === 'POST' && run) {
      const id = randomBytes(9).toString('base64url');
      const cap = Number(new URL(req.url ?? '/', 'http://standin').searchParams.get('maxTotalChargeUsd') ?? Infinity);
      const r = { actId: run[1] as string, started: Date.now(), cap: Number.isFinite(cap) ? cap : Infinity };
      runs.set(id, r);
      const now = new Date(r.started).toISOString();
      return json(res, 201, {
        data: { id, actId: r.actId, status: 'READY', startedAt: now, defaultDatasetId: randomBytes(8).toString('hex'), usageTotalUsd: 0 },
      });
    }
    const asked = /^\/v2\/actor-runs\/([^/]+)$/.exec(path);
    if (req.method === 'GET' && asked) {
      const r = runs.get(asked[1] as string);
      if (r !== undefined) return json(res, 200, object(asked[1] as string, r));
      return json(res, 404, { error: { type: 'record-not-found', message: 'Actor run was not found' } });
    }
    if (req.method === 'POST' && /^\/v2\/acts\/[^/]+\/run-sync-get-dataset-items$/.test(path)) {
      return json(res, 201, [{ url: 'https://example.com/', title: 'Example Domain' }]);
    }
    return json(res, 404, { error: { type: 'page-not-found', message: 'Page not found' } });
  };
}

const seo: Handler = (req, res, body, path) => {
  // The top-level `cost` is the call's, in US dollars; each task carries its own.
  const envelope = (result: unknown[], cost: number): object => ({
    version: '0.1.20250101',
    status_code: 20000,
    status_message: 'Ok.',
    cost,
    tasks_count: 1,
    tasks: [{ id: randomBytes(8).toString('hex'), status_code: 20000, status_message: 'Ok.', cost, result }],
  });
  if (req.method === 'GET' && path === '/v3/appendix/user_data') {
    return json(res, 200, envelope([{ login: 'demo', timezone: 'UTC', money: { total: 100, balance: 42.5, currency: 'USD' } }], 0));
  }
  if (req.method === 'POST' && path === '/v3/serp/google/organic/live/advanced') {
    let keyword = 'keyword';
    try {
      keyword = (JSON.parse(body.toString('utf8')) as Array<{ keyword?: string }>)[0]?.keyword ?? keyword;
    } catch {
      // a demo: any body will do
    }
    // A live SERP task: a fraction of a cent.
    return json(res, 200, envelope([{ keyword, items_count: 1, items: [{ type: 'organic', rank_absolute: 1, url: 'https://example.com/' }] }], 0.002));
  }
  return json(res, 404, { status_code: 40400, status_message: 'Not Found.' });
};

/** Characters billed for a synthesis: the request's `text`, as the provider counts them. */
function characters(body: Buffer): number {
  try {
    const text = (JSON.parse(body.toString('utf8')) as { text?: unknown }).text;
    return typeof text === 'string' ? [...text].length : 0;
  } catch {
    return 0;
  }
}

const speech: Handler = (req, res, body, path) => {
  if (req.method === 'GET' && path === '/v1/voices') {
    return json(res, 200, { voices: [{ voice_id: '21m00Tcm4TlvDq8ikWAM', name: 'Rachel', category: 'premade' }] });
  }
  if (req.method === 'GET' && path === '/v1/user') {
    return json(res, 200, { subscription: { tier: 'demo', character_count: 0, character_limit: 10000 } });
  }
  if (req.method === 'GET' && path === '/v1/convai/conversation/get-signed-url') {
    return json(res, 200, { signed_url: `wss://speech.invalid/v1/convai/conversation?conversation_signature=${randomBytes(12).toString('hex')}` });
  }
  if (req.method === 'POST' && /^\/v1\/text-to-speech\/[^/]+\/stream$/.test(path)) {
    // Eight chunks over two seconds, as a streaming synthesis arrives; billed per character.
    res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': String(characters(body)) });
    let sent = 0;
    const timer = setInterval(() => {
      res.write(fakeMp3(8192));
      if (++sent === 8) {
        clearInterval(timer);
        res.end();
      }
    }, 250);
    res.on('close', () => clearInterval(timer));
    return;
  }
  if (req.method === 'POST' && /^\/v1\/text-to-speech\/[^/]+$/.test(path)) {
    const audio = fakeMp3(32768);
    res.writeHead(200, { 'content-type': 'audio/mpeg', 'content-length': audio.length, 'character-cost': String(characters(body)) });
    return void res.end(audio);
  }
  return json(res, 404, { detail: { status: 'not_found', message: 'Not found' } });
};

/** A provider without a realistic stand-in: its examples answered with their status and an echo. */
const generic =
  (spec: UpstreamSpec): Handler =>
  (req, res, _body, path) => {
    const example = spec.demo.examples.find((e) => e.method === req.method && e.path === path);
    if (example === undefined) return json(res, 404, { error: 'not found' });
    return json(res, example.status, { ok: true, provider: spec.name, method: req.method, path });
  };

const REALISTIC: Readonly<Record<string, () => Handler>> = { scraper: scraperStandin, seo: () => seo, speech: () => speech };

/** One of the credentials a stand-in accepts: its secrets (one per `secretEnvs` entry), and how often its account is busy. */
export interface StandinCredential {
  readonly secrets: readonly string[];
  /** Every n-th request made with it answers 429 with `Retry-After` (the account's own limit, now and then); absent: never. */
  readonly busyEvery?: number;
}

export interface StandinOptions {
  /** Route name → every credential its stand-in accepts, numbered from 1; absent: the one given in `secrets`. */
  readonly credentials?: Readonly<Record<string, readonly StandinCredential[]>>;
}

/** How long a busy credential asks to be left alone, seconds. */
export const STANDIN_BUSY_RETRY_AFTER = 2;

/** A provider's own answer to a key it does not know, where its shape matters (routes.ts, `unauthorized`). */
const UNAUTHORIZED: Readonly<Record<string, unknown>> = {
  speech: { detail: { status: 'invalid_api_key', message: 'Invalid API key' } },
};

/** Answers 401 unless the request carries exactly one of the credentials `spec` injects; 429 when that one's account is busy. */
function standin(spec: UpstreamSpec, accepted: readonly StandinCredential[]): Handler {
  const headers = accepted.map((c) => ({ header: spec.credential(c.secrets), busyEvery: c.busyEvery, calls: 0 }));
  const answer = REALISTIC[spec.name]?.() ?? generic(spec);
  return (req, res, body, path) => {
    const used = headers.find(({ header: [name, value] }) => same(req.headers[name], value));
    if (used === undefined) return json(res, 401, UNAUTHORIZED[spec.name] ?? { error: 'invalid credential' });
    if (used.busyEvery !== undefined && ++used.calls % used.busyEvery === 0) {
      res.setHeader('retry-after', String(STANDIN_BUSY_RETRY_AFTER));
      return json(res, 429, { detail: { status: 'too_many_concurrent_requests', message: 'Too many concurrent requests on this account.' } });
    }
    answer(req, res, body, path);
  };
}

function serve(handler: Handler): Promise<http.Server> {
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => handler(req, res, Buffer.concat(chunks), (req.url ?? '').split('?')[0] as string));
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

/** One stand-in per provider, each expecting the secrets given for it (route name → one per `secretEnvs` entry), or the credentials of `options`. */
export async function startStandins(
  secrets: Readonly<Record<string, readonly string[]>>,
  specs: readonly UpstreamSpec[],
  options: StandinOptions = {},
): Promise<Standins> {
  const servers = await Promise.all(specs.map((spec) => serve(standin(spec, options.credentials?.[spec.name] ?? [{ secrets: secrets[spec.name] ?? [] }]))));
  const urls: Record<string, string> = {};
  specs.forEach((spec, i) => (urls[spec.name] = `http://127.0.0.1:${((servers[i] as http.Server).address() as AddressInfo).port}`));
  return {
    urls,
    close: async () => {
      await Promise.all(
        servers.map(
          (s) =>
            new Promise<void>((resolve) => {
              s.closeAllConnections();
              s.close(() => resolve());
            }),
        ),
      );
    },
  };
}
