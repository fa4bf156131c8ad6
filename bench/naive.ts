// The naive peer: http-proxy-3 used the way its README shows, plus the
// minimum a gateway needs (a bearer check, prefix routing, the header swap
// in `proxyReq`) and a keep-alive agent. What most people would write first.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { createProxyServer } from 'http-proxy-3';
import { UPSTREAMS } from '../src/request/routes.ts';

const env = process.env;
// One port for every route, or a port per route (each route on an origin of its own).
const ports = JSON.parse(env.BENCH_UPSTREAM_PORTS ?? 'null') as number | Record<string, number>;
const upstream = (route: string): string => `http://127.0.0.1:${typeof ports === 'number' ? ports : ports[route]}`;
const clients = new Set([`Bearer ${env.BENCH_CLIENT_TOKEN}`]);
// The credential swap of each provider, from the same table keyward reads.
const secrets = JSON.parse(env.BENCH_SECRETS ?? '{}') as Record<string, string[]>;
const routes: Record<string, readonly [string, string]> = Object.fromEntries(UPSTREAMS.map((spec) => [spec.name, spec.credential(secrets[spec.name] ?? [])]));

const proxy = createProxyServer({ changeOrigin: true, agent: new http.Agent({ keepAlive: true, maxSockets: Infinity }) });
proxy.on('proxyReq', (proxyReq, req) => {
  const cred = routes[(req as http.IncomingMessage & { route: string }).route];
  proxyReq.removeHeader('authorization');
  if (cred) proxyReq.setHeader(cred[0], cred[1]);
});
proxy.on('error', (_err, _req, res) => {
  const r = res as http.ServerResponse;
  if (!r.headersSent) r.writeHead(502);
  r.end();
});

const server = http.createServer((req, res) => {
  if (!clients.has(req.headers.authorization ?? '')) {
    res.writeHead(401);
    return res.end();
  }
  const url = req.url ?? '/';
  const slash = url.indexOf('/', 1);
  const route = url.slice(1, slash);
  if (slash < 0 || !(route in routes)) {
    res.writeHead(404);
    return res.end();
  }
  (req as http.IncomingMessage & { route: string }).route = route;
  req.url = url.slice(slash);
  proxy.web(req, res, { target: upstream(route) });
});
server.listen(0, '127.0.0.1', () => process.stdout.write(`${JSON.stringify({ port: (server.address() as AddressInfo).port })}\n`));
process.on('SIGTERM', () => process.exit(0));
