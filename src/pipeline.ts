// One request's way through the gateway (design §1–§3, §6):
//   id → auth → route → guards → rewrite → forward → completion log.
// Authentication comes before routing, so an unauthenticated caller learns
// nothing about which paths exist.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { randomBytes } from 'node:crypto';
import type { Config } from './config.ts';
import { ERRORS, sendError, writeRawError, type GatewayError } from './errors.ts';
import { Exchange, type GatewayRequest } from './exchange.ts';
import type { Forwarder } from './forward.ts';
import { METHOD_OVERRIDE_HEADERS, upstreamRequestHeaders } from './headers.ts';
import { bearerToken, type KeySet, type Principal } from './keys/keyset.ts';
import { TOKEN_PATTERN } from './keys/token.ts';
import type { Logger } from './log.ts';
import { dropParams, hasParam } from './query.ts';
import { matchRoute, type RouteTable } from './routes.ts';

export interface PipelineDeps {
  readonly config: Config;
  readonly table: RouteTable;
  readonly forwarders: ReadonlyMap<string, Forwarder>;
  readonly logger: Logger;
  keys(): KeySet;
  draining(): boolean;
}

export interface Pipeline {
  /** `expectContinue`: the client waits for `100 Continue` before sending its body. */
  handle(req: GatewayRequest, res: ServerResponse, expectContinue: boolean): void;
  /** Requests Node hands over without a response object: upgrades and CONNECT. */
  refuseRaw(req: GatewayRequest, socket: Duplex, err: GatewayError): void;
}

/** Every credential query name of every route: scrubbed from logged paths that matched no route. */
function allCredentialParams(table: RouteTable): ReadonlySet<string> {
  const names = new Set<string>();
  for (const route of table.values()) for (const n of route.dropQuery) names.add(n);
  return names;
}

function scrubTokens(text: string): string {
  return text.includes('kw_') ? text.replace(TOKEN_PATTERN, 'kw_[redacted]') : text;
}

function hasBody(req: GatewayRequest): boolean {
  const cl = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0');
}

export function createPipeline(deps: PipelineDeps): Pipeline {
  const { config, table, forwarders, logger } = deps;
  const maxBody = config.maxBodyBytes;
  const credentialParams = allCredentialParams(table);
  // Request ids: unique per process start, cheap to make, sortable within a process.
  const boot = randomBytes(4).toString('hex');
  let counter = 0;

  function authenticate(req: GatewayRequest): { token: string; principal: Principal } | null {
    const token = bearerToken(req.headers.authorization);
    if (token === null) return null;
    const principal = deps.keys().lookup(token, Date.now());
    return principal === null ? null : { token, principal };
  }

  function logPathOf(ex: Exchange): string {
    if (ex.logPath !== null) return ex.logPath;
    const q = ex.url.indexOf('?');
    if (q < 0) return scrubTokens(ex.url);
    const query = dropParams(ex.url.slice(q + 1), credentialParams);
    return scrubTokens(query === '' ? ex.url.slice(0, q) : `${ex.url.slice(0, q)}?${query}`);
  }

  function logCompletion(ex: Exchange, req: GatewayRequest, status: number | null, bytesOut: number, aborted: boolean): void {
    const fields = {
      reqId: ex.id,
      keyId: ex.principal?.id ?? null,
      keyName: ex.principal?.name ?? null,
      route: ex.route?.name ?? null,
      method: req.method,
      path: logPathOf(ex),
      status,
      bytesIn: ex.bytesIn >= 0 ? ex.bytesIn : req.complete ? Number(req.headers['content-length'] ?? 0) : null,
      bytesOut,
      durationMs: Math.round((performance.now() - ex.start) * 1000) / 1000,
      ttfbMs: ex.ttfbMs >= 0 ? Math.round(ex.ttfbMs * 1000) / 1000 : null,
      error: ex.failure,
      aborted,
    };
    if (ex.upstreamFailed) logger.warn(fields, 'request completed');
    else if (status !== null && status >= 500) logger.error(fields, 'request completed');
    else logger.info(fields, 'request completed');
  }

  function onResponseClose(this: ServerResponse): void {
    const req = this.req as GatewayRequest;
    const ex = req.exchange as Exchange;
    ex.closed = true;
    ex.stopTimer();
    logCompletion(ex, req, this.headersSent ? this.statusCode : null, ex.socket.bytesWritten - ex.bytesWritten0, !this.writableFinished);
  }

  function refuse(ex: Exchange, req: GatewayRequest, res: ServerResponse, err: GatewayError): void {
    ex.settled = true;
    ex.failure = err.code;
    // An unread body is still on the wire: close rather than parse it as the next request.
    sendError(res, err, hasBody(req) || deps.draining());
  }

  // Counts chunked bodies (whose size is not known up front) and enforces the limit on them.
  function countChunk(this: GatewayRequest, chunk: Buffer): void {
    const ex = this.exchange as Exchange;
    if (ex.settled) return;
    ex.bytesIn += chunk.length;
    if (ex.bytesIn <= maxBody) return;
    ex.stopTimer();
    ex.settled = true;
    ex.failure = ERRORS.payloadTooLarge.code;
    ex.proxyReq?.destroy();
    this.unpipe();
    if (ex.res !== null) sendError(ex.res, ERRORS.payloadTooLarge, true);
  }

  function handle(req: GatewayRequest, res: ServerResponse, expectContinue: boolean): void {
    const url = req.url as string;
    const ex = new Exchange(`${boot}-${(++counter).toString(36)}`, req.socket, url);
    ex.res = res;
    req.exchange = ex;
    res.once('close', onResponseClose);

    if (deps.draining()) return refuse(ex, req, res, ERRORS.shuttingDown);

    const auth = authenticate(req);
    if (auth === null) return refuse(ex, req, res, ERRORS.unauthorized);
    ex.principal = auth.principal;

    const method = req.method as string;
    const match = matchRoute(table, method, url);
    if (match.error !== null) return refuse(ex, req, res, match.error);
    const route = match.route;
    ex.route = route;

    // The client's token must not travel upstream in any form (design §2).
    if (url.includes(auth.token)) return refuse(ex, req, res, ERRORS.tokenInQuery);
    // Method overrides would side-step the route's method list (design §1).
    if (match.query !== null && hasParam(match.query, route.overrideQuery)) return refuse(ex, req, res, ERRORS.methodOverride);
    for (const h of METHOD_OVERRIDE_HEADERS) if (req.headers[h] !== undefined) return refuse(ex, req, res, ERRORS.methodOverride);
    if (route.credential === null) return refuse(ex, req, res, ERRORS.routeNotConfigured);

    // Node's parser already refused CL+TE and a TE whose last coding is not
    // chunked; anything but a plain `chunked` (e.g. `gzip, chunked`) would
    // reach the upstream re-framed and mislabelled, so refuse it here.
    const te = req.headers['transfer-encoding'];
    if (te !== undefined && te.toLowerCase() !== 'chunked') return refuse(ex, req, res, ERRORS.malformed);
    const cl = req.headers['content-length'];
    if (cl !== undefined && Number(cl) > maxBody) return refuse(ex, req, res, ERRORS.payloadTooLarge);

    const query = match.query === null ? '' : dropParams(match.query, route.dropQuery);
    const suffix = query === '' ? match.path : `${match.path}?${query}`;
    ex.logPath = scrubTokens(route.prefix + suffix.slice(1));
    req.url = route.basePath + suffix;
    // http-proxy-3 copies req.headers into the upstream request, whatever their declared type.
    req.headers = upstreamRequestHeaders(req.headers, route, route.credential, auth.token) as typeof req.headers;

    if (expectContinue) res.writeContinue();
    (forwarders.get(route.name) as Forwarder).forward(req, res, ex);
    if (te !== undefined) {
      ex.bytesIn = 0;
      req.on('data', countChunk);
    }
  }

  function refuseRaw(req: GatewayRequest, socket: Duplex, err: GatewayError): void {
    const ex = new Exchange(`${boot}-${(++counter).toString(36)}`, req.socket, req.url as string);
    const auth = authenticate(req);
    const answer = auth === null ? ERRORS.unauthorized : err;
    ex.principal = auth?.principal ?? null;
    ex.failure = answer.code;
    writeRawError(socket as Socket, answer);
    logCompletion(ex, req, answer.status, 0, false);
  }

  return { handle, refuseRaw };
}
