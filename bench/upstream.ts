// The benchmarks' upstream stand-in, run as its own process. Fast and
// predictable: bodies are prebuilt, and every route checks the credential
// the system under test is meant to inject (a wrong swap fails validation).
import { randomBytes } from 'node:crypto';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { UPSTREAMS } from '../src/request/routes.ts';
import { dataset } from './dataset.ts';
import { acceptedCredentials } from './systems.ts';

const env = process.env;
const given = {
  upstream: JSON.parse(env.BENCH_SECRETS ?? '{}') as Record<string, string[]>,
  more: JSON.parse(env.BENCH_MORE_SECRETS ?? '{}') as Record<string, string[][]>,
};
const byRoute = new Map(UPSTREAMS.map((u) => [u.name, acceptedCredentials(given, u.name)]));
/** Whether `req` carries one of the credentials the provider table says `route` gets (1 to 3), and no client Authorization besides. */
function credentialed(req: http.IncomingMessage, route: string): boolean {
  const a = byRoute.get(route);
  if (a === undefined) return false;
  const got = req.headers[a.name];
  return typeof got === 'string' && a.values.includes(got) && (a.name === 'authorization' || req.headers.authorization === undefined);
}

export const SMALL_BODY = Buffer.from(
  JSON.stringify({
    data: {
      id: 'HG7ML7M8z78YcAPEB',
      actId: 'x',
      userId: 'u',
      startedAt: '2026-01-01T00:00:00.000Z',
      status: 'READY',
      meta: { origin: 'API' },
      pad: 'x'.repeat(800),
    },
  }),
);
const RUN_ENDED = Buffer.from(JSON.stringify({ data: { id: 'HG7ML7M8z78YcAPEB', actId: 'x', status: 'SUCCEEDED', usageTotalUsd: 0 } }));
const READ_BODY = Buffer.from(
  JSON.stringify({
    version: '0.1',
    status_code: 20000,
    status_message: 'Ok.',
    tasks: [{ id: 't', status_code: 20000, result: [{ login: 'bench', money: { balance: 42.5 } }] }],
  }),
);
const AUDIO = randomBytes(10 * 1024 * 1024);
/** A scraper dataset download: 10 MiB of JSON text, the scraper's common large answer. */
const DATASET = dataset(10 * 1024 * 1024);
const SLOW_CHUNK = randomBytes(4096);
const SLOW_CHUNKS = 16; // 64 KiB
const SLOW_MS = Number(env.BENCH_SLOW_MS ?? 5000);

function send(res: http.ServerResponse, status: number, type: string, body: Buffer): void {
  res.writeHead(status, { 'content-type': type, 'content-length': body.length });
  res.end(body);
}

const server = http.createServer({ keepAliveTimeout: 120_000, headersTimeout: 130_000, requestTimeout: 0 }, (req, res) => {
  const url = req.url ?? '';
  if (url === '/v2/acts/x/run-sync-get-dataset-items' && req.method === 'POST') {
    if (!credentialed(req, 'scraper')) return send(res, 401, 'text/plain', Buffer.from('bad credential'));
    req.resume();
    return req.on('end', () => send(res, 200, 'application/json; charset=utf-8', DATASET));
  }
  if (url === '/v2/actor-runs/HG7ML7M8z78YcAPEB' && req.method === 'GET') {
    // The gateway settling the small request's run (docs/limits.md, "Scraper runs"): it ended, free.
    if (!credentialed(req, 'scraper')) return send(res, 401, 'text/plain', Buffer.from('bad credential'));
    return send(res, 200, 'application/json', RUN_ENDED);
  }
  if (url.startsWith('/v2/acts/') && req.method === 'POST') {
    if (!credentialed(req, 'scraper')) return send(res, 401, 'text/plain', Buffer.from('bad credential'));
    req.resume();
    return req.on('end', () => send(res, 201, 'application/json', SMALL_BODY));
  }
  if (url === '/v3/appendix/user_data') {
    if (!credentialed(req, 'seo')) return send(res, 401, 'text/plain', Buffer.from('bad credential'));
    return send(res, 200, 'application/json', READ_BODY);
  }
  if (!credentialed(req, 'speech')) return send(res, 401, 'text/plain', Buffer.from('bad credential'));
  if (url === '/v1/history/x/audio') return send(res, 200, 'audio/mpeg', AUDIO);
  if (url === '/v1/text-to-speech/slow') {
    res.writeHead(200, { 'content-type': 'audio/mpeg' });
    let sent = 0;
    const timer = setInterval(() => {
      res.write(SLOW_CHUNK);
      if (++sent === SLOW_CHUNKS) {
        clearInterval(timer);
        res.end();
      }
    }, SLOW_MS / SLOW_CHUNKS);
    res.on('close', () => clearInterval(timer));
    return;
  }
  if (url === '/v1/speech-to-text' && req.method === 'POST') {
    let bytes = 0;
    req.on('data', (c: Buffer) => (bytes += c.length));
    return req.on('end', () => send(res, 200, 'application/json', Buffer.from(JSON.stringify({ bytes }))));
  }
  send(res, 404, 'text/plain', Buffer.from('not found'));
});
server.maxConnections = 100_000;
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`${JSON.stringify({ port: (server.address() as AddressInfo).port })}\n`);
});
process.on('SIGTERM', () => process.exit(0));
