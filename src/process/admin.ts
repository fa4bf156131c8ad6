// The admin listener (docs/operations.md): health, readiness and metrics on their own
// address, never on the public port, where every path needs a token.
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { listenOn } from './listen.ts';
import type { Logger } from '../observe/log.ts';
import type { Readiness } from './server.ts';
import { PageBusy } from '../views/page-thread.ts';
import { within } from '../lib/deadline.ts';

/** The longest the usage page waits for the ledger's store before answering 503 `usage_unavailable`, ms. */
export const PAGE_WAIT_MS = 10_000;

/** The usage page's policy (docs/limits.md): no script, styles of its own, forms only to itself. */
export const USAGE_PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'";

export interface AdminSources {
  readiness(): Readiness | Promise<Readiness>;
  metrics(): Promise<string>;
  readonly metricsContentType: string;
  /** The usage page for these query parameters (views/page.ts); absent: 404. */
  usage?: ((params: URLSearchParams) => Promise<string>) | undefined;
  /** The admin API under /v1/ (admin/api.ts), and whose admin token a request carries; absent: /v1/ is 404. */
  api?:
    | {
        handle(req: http.IncomingMessage, res: http.ServerResponse): void;
        admin(req: http.IncomingMessage): Promise<unknown>;
      }
    | undefined;
}

/**
 * A listener on a loopback address is reached only from this host; on any
 * other, the usage page needs an admin token too (docs/admin-api.md,
 * "Safety"). The API itself always does.
 */
export function isLoopbackHost(host: string): boolean {
  return host === 'localhost' || host === '::1' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host) || /^::ffff:127\./i.test(host);
}

export interface Admin {
  readonly port: number;
  /** Log `admin listening`, when startAdmin was told to wait (the public port binds first). */
  announce(): void;
  close(): Promise<void>;
}

function json(res: http.ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), 'cache-control': 'no-store' });
  res.end(text);
}

/**
 * The metrics text, asked twice before a 500: with workers, one that does
 * not answer the primary within prom-client's 5 s (a machine under load)
 * fails the whole scrape, and the next ask usually finds it free.
 */
function serveMetrics(res: http.ServerResponse, sources: AdminSources, logger: Logger): void {
  void sources
    .metrics()
    .catch(() => sources.metrics())
    .then(
      (text) => {
        res.writeHead(200, { 'content-type': sources.metricsContentType, 'cache-control': 'no-store' });
        res.end(text);
      },
      (err: Error) => {
        logger.error({ err }, 'metrics not gathered');
        json(res, 500, { error: 'Metrics could not be gathered.', code: 'metrics_unavailable' });
      },
    );
}

function unauthorized(res: http.ServerResponse): void {
  res.setHeader('www-authenticate', 'Bearer realm="keyward admin"');
  json(res, 401, { error: 'An admin token is required (Authorization: Bearer kwa_…).', code: 'unauthorized' });
}

/** The usage page (docs/limits.md, "The usage page"), within PAGE_WAIT_MS. */
function usagePage(req: http.IncomingMessage, res: http.ServerResponse, url: string, sources: AdminSources, logger: Logger): void {
  const page = sources.usage;
  if (page === undefined) return json(res, 404, { error: 'Not found.', code: 'not_found' });
  const built = page(new URLSearchParams(url.includes('?') ? url.slice(url.indexOf('?') + 1) : ''));
  // A store that does not answer: 503 within a stated time, never a page that hangs (docs/limits.md, "The usage page").
  void within(built, PAGE_WAIT_MS, null).then(
    (html) => {
      if (html === null) {
        res.setHeader('retry-after', '5');
        return json(res, 503, { error: `The usage ledger did not answer within ${PAGE_WAIT_MS / 1000} s.`, code: 'usage_unavailable' });
      }
      const body = Buffer.from(html);
      // No script runs on the page; none may.
      res.writeHead(200, {
        'content-type': 'text/html; charset=utf-8',
        'content-length': body.length,
        'cache-control': 'no-store',
        'content-security-policy': USAGE_PAGE_CSP,
        'x-content-type-options': 'nosniff',
      });
      res.end(req.method === 'HEAD' ? undefined : body);
    },
    (err: Error) => {
      if (err instanceof PageBusy) {
        res.setHeader('retry-after', '1');
        return json(res, 503, { error: 'The usage page is busy building other views; try again in a moment.', code: 'usage_busy' });
      }
      logger.error({ err }, 'usage page not built');
      json(res, 503, { error: 'The usage ledger could not be read.', code: 'usage_unavailable' });
    },
  );
}

/**
 * The admin listener, bound. `announce`: log `admin listening` now; false
 * leaves it to the caller (Admin.announce), so that nothing says listening
 * before every port a process needs is bound.
 */
export async function startAdmin(
  address: { host: string; port: number; tokenForUsage?: true },
  sources: AdminSources,
  logger: Logger,
  announce = true,
): Promise<Admin> {
  const loopback = address.tokenForUsage !== true && isLoopbackHost(address.host);
  const server = http.createServer({ requireHostHeader: false, headersTimeout: 10_000, requestTimeout: 30_000 }, (req, res) => {
    const url = req.url ?? '';
    const path = url.split('?')[0] ?? '';
    if (path === '/v1' || path.startsWith('/v1/')) {
      if (sources.api === undefined) return json(res, 404, { error: 'Not found.', code: 'not_found' });
      return sources.api.handle(req, res);
    }
    if (req.method !== 'GET' && req.method !== 'HEAD') return json(res, 404, { error: 'Not found.', code: 'not_found' });
    if (path === '/usage' && !loopback) {
      // Off loopback, the page shows every key's spend: an admin token first (any role).
      const api = sources.api;
      void (api === undefined ? Promise.resolve(null) : api.admin(req)).then(
        (who) => (who === null ? unauthorized(res) : usagePage(req, res, url, sources, logger)),
        () => unauthorized(res),
      );
      return;
    }
    switch (path) {
      case '/healthz':
        return json(res, 200, { status: 'ok' });
      case '/readyz':
        void Promise.resolve(sources.readiness()).then(
          (r) => json(res, r.ready ? 200 : 503, { status: r.ready ? 'ready' : 'not ready', ...r }),
          (err: Error) => json(res, 503, { status: 'not ready', ready: false, reason: err.message }),
        );
        return;
      case '/metrics':
        return serveMetrics(res, sources, logger);
      case '/usage':
        return usagePage(req, res, url, sources, logger);
      default:
        return json(res, 404, { error: 'Not found.', code: 'not_found' });
    }
  });
  await listenOn(server, address.port, address.host, 'KEYWARD_ADMIN_PORT');
  const port = (server.address() as AddressInfo).port;
  const said = (): void => logger.info({ address: address.host, port }, 'admin listening');
  if (announce) said();
  return {
    port,
    announce: announce ? () => undefined : said,
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}
