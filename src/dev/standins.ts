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

const scraper: Handler = (req, res, _body, path) => {
  const run = /^\/v2\/acts\/([^/]+)\/runs$/.exec(path);
  if (req.method === 'POST' && run) {
    const now = new Date().toISOString();
    return json(res, 201, {
      data: { id: randomBytes(8).toString('hex'), actId: run[1], status: 'READY', startedAt: now, defaultDatasetId: randomBytes(8).toString('hex') },
    });
  }
  if (req.method === 'POST' && /^\/v2\/acts\/[^/]+\/run-sync-get-dataset-items$/.test(path)) {
    return json(res, 201, [{ url: 'https://example.com/', title: 'Example Domain' }]);
  }
  return json(res, 404, { error: { type: 'page-not-found', message: 'Page not found' } });
};

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

const REALISTIC: Readonly<Record<string, Handler>> = { scraper, seo, speech };

/** Answers 401 unless the request carries exactly the credential `spec` injects. */
function standin(spec: UpstreamSpec, secrets: readonly string[]): Handler {
  const [header, value] = spec.credential(secrets);
  const answer = REALISTIC[spec.name] ?? generic(spec);
  return (req, res, body, path) => {
    if (!same(req.headers[header], value)) return json(res, 401, { error: 'invalid credential' });
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

/** One stand-in per provider, each expecting the secrets given for it (route name → one per `secretEnvs` entry). */
export async function startStandins(secrets: Readonly<Record<string, readonly string[]>>, specs: readonly UpstreamSpec[]): Promise<Standins> {
  const servers = await Promise.all(specs.map((spec) => serve(standin(spec, secrets[spec.name] ?? []))));
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
