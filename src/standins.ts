// Local stand-ins for the three upstreams, for `keyward demo`: they answer the
// common paths with realistic bodies and refuse any request that lacks the
// credential the gateway is meant to inject, which is what the demo shows.
import { randomBytes, timingSafeEqual } from 'node:crypto';
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface StandinSecrets {
  readonly scraperToken: string;
  readonly seoLogin: string;
  readonly seoPassword: string;
  readonly speechKey: string;
}

export interface Standins {
  readonly urls: { readonly scraper: string; readonly seo: string; readonly speech: string };
  close(): Promise<void>;
}

type Handler = (req: IncomingMessage, res: ServerResponse, body: Buffer) => void;

function json(res: ServerResponse, status: number, value: unknown): void {
  const body = JSON.stringify(value);
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8', 'content-length': Buffer.byteLength(body) });
  res.end(body);
}

function same(a: string | undefined, b: string): boolean {
  const x = Buffer.from(a ?? '');
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

/** Bytes shaped like an MPEG audio stream: frame headers (0xFFFB) and noise. */
export function fakeMp3(bytes: number): Buffer {
  const buf = randomBytes(bytes);
  for (let i = 0; i + 1 < bytes; i += 418) {
    buf[i] = 0xff;
    buf[i + 1] = 0xfb;
  }
  return buf;
}

const scraper = (token: string): Handler => (req, res) => {
  if (!same(req.headers.authorization, `Bearer ${token}`)) return json(res, 401, { error: { type: 'token-not-valid', message: 'Authentication token is not valid.' } });
  const path = (req.url ?? '').split('?')[0] as string;
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

const seo = (login: string, password: string): Handler => (req, res, body) => {
  if (!same(req.headers.authorization, `Basic ${Buffer.from(`${login}:${password}`).toString('base64')}`)) {
    return json(res, 401, { status_code: 40100, status_message: 'You are not authorized to access this resource.' });
  }
  const path = (req.url ?? '').split('?')[0];
  const envelope = (result: unknown[]): object => ({
    version: '0.1.20250101',
    status_code: 20000,
    status_message: 'Ok.',
    tasks_count: 1,
    tasks: [{ id: randomBytes(8).toString('hex'), status_code: 20000, status_message: 'Ok.', result }],
  });
  if (req.method === 'GET' && path === '/v3/appendix/user_data') {
    return json(res, 200, envelope([{ login, timezone: 'UTC', money: { total: 100, balance: 42.5, currency: 'USD' } }]));
  }
  if (req.method === 'POST' && path === '/v3/serp/google/organic/live/advanced') {
    let keyword = 'keyword';
    try {
      keyword = (JSON.parse(body.toString('utf8')) as Array<{ keyword?: string }>)[0]?.keyword ?? keyword;
    } catch {
      // a demo: any body will do
    }
    return json(res, 200, envelope([{ keyword, items_count: 1, items: [{ type: 'organic', rank_absolute: 1, url: 'https://example.com/' }] }]));
  }
  return json(res, 404, { status_code: 40400, status_message: 'Not Found.' });
};

const speech = (key: string): Handler => (req, res) => {
  if (!same(req.headers['xi-api-key'] as string | undefined, key)) return json(res, 401, { detail: { status: 'invalid_api_key', message: 'Invalid API key' } });
  const path = (req.url ?? '').split('?')[0] as string;
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
    // Eight chunks over two seconds, as a streaming synthesis arrives.
    res.writeHead(200, { 'content-type': 'audio/mpeg' });
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
    res.writeHead(200, { 'content-type': 'audio/mpeg', 'content-length': audio.length });
    return void res.end(audio);
  }
  return json(res, 404, { detail: { status: 'not_found', message: 'Not found' } });
};

function serve(handler: Handler): Promise<http.Server> {
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => handler(req, res, Buffer.concat(chunks)));
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

export async function startStandins(secrets: StandinSecrets): Promise<Standins> {
  const servers = await Promise.all([
    serve(scraper(secrets.scraperToken)),
    serve(seo(secrets.seoLogin, secrets.seoPassword)),
    serve(speech(secrets.speechKey)),
  ]);
  const url = (s: http.Server): string => `http://127.0.0.1:${(s.address() as AddressInfo).port}`;
  return {
    urls: { scraper: url(servers[0]), seo: url(servers[1]), speech: url(servers[2]) },
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
