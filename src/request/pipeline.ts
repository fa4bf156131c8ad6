// One request's way through the gateway (docs/routes.md, authentication.md, responses.md, logs.md):
//   id → auth → route → guards → rewrite → forward → completion.
// Authentication comes before routing, so an unauthenticated caller learns
// nothing about which paths exist.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { randomBytes } from 'node:crypto';
import { presentedToken } from './auth.ts';
import type { Complete } from './completion.ts';
import { ERRORS, limitRefusal, type GatewayError } from './errors.ts';
import { answer, isClosing, writeRawError } from './reply.ts';
import { Exchange, exchangeOf, type GatewayRequest } from './exchange.ts';
import { runGuards } from './guards.ts';
import { upstreamRequestHeaders } from './headers.ts';
import type { LastUse } from '../keys/last-use.ts';
import type { KeySet, Principal } from '../keys/keyset.ts';
import { isWellFormed, redactTokens } from '../keys/token.ts';
import { neverConnected } from './outcome.ts';
import type { AuthFailure, Metrics } from '../observe/metrics.ts';
import { capParam, dropParams } from './query.ts';
import { matchRoute, type Route, type RouteTable } from './routes.ts';
import type { Generation, Target } from './runtime.ts';
import type { Sweeper } from './timers.ts';
import type { Ledger } from '../ledger/ledger.ts';
import type { Admit } from '../limits/admissions.ts';
import type { Admission, LimitCode, Refused } from '../limits/limiter.ts';
import { policyFor } from '../limits/policy.ts';
import { isSyncRun, runStartPrefix } from '../ledger/runs.ts';

const LIMIT_ERRORS: Readonly<Record<LimitCode, GatewayError>> = {
  rate_limited: ERRORS.rateLimited,
  concurrency_limited: ERRORS.concurrencyLimited,
  quota_exceeded: ERRORS.quotaExceeded,
  budget_exceeded: ERRORS.budgetExceeded,
};
const LIMIT_METRIC = { rate_limited: 'rate', concurrency_limited: 'concurrency', quota_exceeded: 'quota', budget_exceeded: 'budget' } as const;

export interface PipelineDeps {
  runtime(): Generation;
  /** The key set, or null while none could be loaded yet (503 keystore_unavailable). */
  keys(): KeySet | null;
  draining(): boolean;
  /** The usage ledger file cannot be read: keys with a quota or budget are refused (503 ledger_unavailable). */
  ledgerDamaged(): boolean;
  readonly sweeper: Sweeper;
  readonly metrics: Metrics;
  readonly lastUse: LastUse;
  readonly complete: Complete;
  /** Admission against a key's limits: in this process, or asked of the primary (workers). */
  readonly admit: Admit;
  readonly ledger: Ledger;
  /** GET /keyward/key's body for this key (views/key-status.ts): at once, or once the primary or the store answered. */
  keyStatus(principal: Principal, now: number): unknown;
}

/** The gateway's own prefix on the public listener (docs/limits.md, "A key's own status"). */
const OWN = '/keyward/';

export type Expect = 'none' | 'continue' | 'other';

/**
 * A request that passed authentication, routing and the guards: what
 * admission and forwarding read, each field typed as the earlier steps made
 * it (the key, its route, where that route goes), not read back from the
 * exchange's nullable fields.
 */
interface Admitted {
  readonly ex: Exchange;
  readonly req: GatewayRequest;
  readonly res: ServerResponse;
  readonly expect: Expect;
  readonly principal: Principal;
  readonly route: Route;
  readonly target: Target;
  readonly path: string;
  readonly forwardQuery: string;
}

export interface Pipeline {
  /**
   * `expect`: `continue` when the client waits for `100 Continue` before
   * sending its body; `other` for any other expectation (refused with 417
   * once the client is authenticated); `none` otherwise.
   */
  handle(req: GatewayRequest, res: ServerResponse, expect: Expect): void;
  /** Requests Node hands over without a response object: upgrades and CONNECT. */
  refuseRaw(req: GatewayRequest, socket: Duplex, err: GatewayError): void;
}

function hasBody(req: GatewayRequest): boolean {
  const cl = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (cl !== undefined && cl !== '0');
}

export function createPipeline(deps: PipelineDeps): Pipeline {
  const { metrics, complete } = deps;
  // Request ids: unique per process start, cheap to make, sortable within a process.
  const boot = randomBytes(4).toString('hex');
  let counter = 0;

  /** Authenticate: the key, or the reason for a 401 (the key is still recorded when it is known). */
  /**
   * `keys` is read once per request by the caller and passed here: read
   * twice, a shared store's staleness limit could run out in between and
   * the second read be null.
   */
  function authenticate(ex: Exchange, table: RouteTable, keys: KeySet): Principal | AuthFailure {
    const token = presentedToken(ex.req.headers, ex.url, table);
    if (token === null) return 'missing';
    if (!isWellFormed(token)) return 'malformed';
    const now = Date.now();
    const found = keys.lookup(token, now);
    if (found === null) return 'unknown';
    // Recorded also when refused (revoked, expired): the log line names the key.
    ex.principal = found.principal;
    if (found.refusal !== null) return found.refusal;
    deps.lastUse.touch(found.principal.id, now);
    return found.principal;
  }

  function onResponseClose(this: ServerResponse): void {
    const req = this.req;
    const ex = exchangeOf(req);
    ex.closed = true;
    if (ex.forwardStart > 0) deps.sweeper.untrack(ex);
    // The client left (or the answer is complete) with its upload unfinished:
    // the upstream request must end too, whatever state the response is in,
    // or its socket stays open until the upstream gives up.
    if (!req.complete && ex.proxyReq !== null && !ex.proxyReq.destroyed) ex.proxyReq.destroy();
    complete(ex, this.headersSent ? this.statusCode : null, !this.writableFinished);
    // In the same tick as the ledger's count: the slot comes back, and what
    // was reserved becomes what was counted (or comes back, if the request
    // never reached the upstream).
    ex.admission?.done(ex.forwardStart > 0 && !neverConnected(ex.failure), ex.cost);
  }

  /** 429 from a key's limits: nothing forwarded, nothing consumed; counted in the ledger and the metrics. */
  function refuseLimited(ex: Exchange, req: GatewayRequest, res: ServerResponse, principal: Principal, route: Route, r: Refused): void {
    metrics.limited(route.index, LIMIT_METRIC[r.code]);
    deps.ledger.limited(principal.id, route.name);
    const headers: Record<string, string | number> = { 'retry-after': r.retryAfter, 'ratelimit-reset': r.reset };
    if (r.limit !== null) headers['ratelimit-limit'] = r.limit;
    if (r.remaining !== null) headers['ratelimit-remaining'] = r.remaining;
    if (r.policy !== null) headers['ratelimit-policy'] = r.policy;
    const base = LIMIT_ERRORS[r.code];
    const err = r.detail === null ? base : limitRefusal(base, r.detail, route.cost?.unit ?? 'usd');
    answer(ex, res, err, hasBody(req) || deps.draining(), headers);
  }

  function refuse(ex: Exchange, req: GatewayRequest, res: ServerResponse, err: GatewayError): void {
    // An unread body is still on the wire: close rather than parse it as the next request.
    answer(ex, res, err, hasBody(req) || deps.draining());
  }

  // Counts chunked bodies (whose size is not known up front) and enforces the limit on them.
  function countChunk(this: GatewayRequest, chunk: Buffer): void {
    const ex = exchangeOf(this);
    if (ex.settled) return;
    ex.bytesIn += chunk.length;
    if (ex.bytesIn <= deps.runtime().config.maxBodyBytes) return;
    ex.proxyReq?.destroy();
    this.unpipe();
    if (ex.res !== null) answer(ex, ex.res, ERRORS.payloadTooLarge, true);
  }

  function handle(req: GatewayRequest, res: ServerResponse, expect: Expect): void {
    const url = req.url as string;
    const ex = new Exchange(`${boot}-${(++counter).toString(36)}`, req, url);
    ex.res = res;
    req.exchange = ex;
    res.once('close', onResponseClose);

    // Pipelined behind a response that closes this connection: the client
    // will never see an answer, so nothing of it may reach (and bill) an upstream.
    if (isClosing(req.socket)) {
      ex.settle({ by: 'client', reason: 'connection_closing' });
      return;
    }
    if (deps.draining()) return refuse(ex, req, res, ERRORS.shuttingDown);
    const keys = deps.keys();
    if (keys === null) return refuse(ex, req, res, ERRORS.keystoreUnavailable);

    const rt = deps.runtime();
    const principal = authenticate(ex, rt.table, keys);
    if (typeof principal === 'string') {
      metrics.authFailure(principal);
      ex.authFailure = principal;
      return refuse(ex, req, res, ERRORS.unauthorized);
    }
    if (expect === 'other') return refuse(ex, req, res, ERRORS.expectationFailed);
    if (url.startsWith(OWN)) return own(ex, req, res, principal, url);

    const match = matchRoute(rt.table, req.method as string, url);
    if (match.error !== null) return refuse(ex, req, res, match.error);
    const route = match.route;
    ex.route = route;

    const forwardQuery = match.query === null ? '' : dropParams(match.query, route.dropQuery);
    const refusal = runGuards({
      headers: req.headers,
      route,
      principal,
      path: match.path,
      query: match.query,
      forwardQuery,
      maxBodyBytes: rt.config.maxBodyBytes,
    });
    if (refusal !== null) {
      if (refusal === ERRORS.forbidden) metrics.limited(route.index, 'scope');
      return refuse(ex, req, res, refusal);
    }
    // The route-configured guard passed, so its target exists; looked up, not assumed.
    const target = rt.targets.get(route.name);
    if (target === undefined) return refuse(ex, req, res, ERRORS.routeNotConfigured);
    const a: Admitted = { ex, req, res, expect, principal, route, target, path: match.path, forwardQuery };
    // A key without limits pays one property read here.
    const policy = principal.limits === undefined ? null : policyFor(principal);
    if (policy === null) return forwardAdmitted(a);
    if (deps.ledgerDamaged() && (policy.quota !== null || policy.budgets.has(route.name))) return refuse(ex, req, res, ERRORS.ledgerUnavailable);
    const admitted = deps.admit(principal, policy, route.name, Date.now());
    if (!(admitted instanceof Promise)) return admittedOrNot(admitted, a);
    // A worker waits for its primary's answer; the request is not read meanwhile.
    void admitted.then((r) => admittedOrNot(r, a));
  }

  function admittedOrNot(r: Admission | Refused, a: Admitted): void {
    if ('code' in r) {
      if (!a.ex.closed) refuseLimited(a.ex, a.req, a.res, a.principal, a.route, r);
      return;
    }
    // The client left while its primary decided: the admission is given back at once.
    if (a.ex.closed) return r.done(false, 0);
    a.ex.admission = r;
    forwardAdmitted(a);
  }

  /** The rest of `handle` once admitted: rewrite and forward. */
  function forwardAdmitted({ ex, req, res, expect, route, target, path, forwardQuery }: Admitted): void {
    // A scraper run-start: its run is settled later, and a key with a budget here has the run capped at what is left.
    if (route.cost?.runs !== undefined) forwardQuery = runStart(ex, req.method as string, route, path, forwardQuery);
    const suffix = forwardQuery === '' ? path : `${path}?${forwardQuery}`;
    ex.logPath = redactTokens(route.prefix + suffix.slice(1));
    req.url = route.basePath + suffix;
    // http-proxy-3 copies req.headers into the upstream request, whatever their declared type.
    req.headers = upstreamRequestHeaders(req.headers, route, target.credential) as typeof req.headers;

    if (expect === 'continue') res.writeContinue();
    metrics.inFlight(route.index, 1);
    deps.sweeper.track(ex);
    target.forwarder.forward(req, res, ex);
    if (req.headers['transfer-encoding'] !== undefined) {
      ex.bytesIn = 0;
      req.on('data', countChunk);
    }
  }

  /**
   * The gateway's own paths: `GET /keyward/key`, the key's own status. Never
   * forwarded, never counted against the key's limits, never refused by them.
   */
  function own(ex: Exchange, req: GatewayRequest, res: ServerResponse, principal: Principal, url: string): void {
    const q = url.indexOf('?');
    if ((q < 0 ? url : url.slice(0, q)) !== `${OWN}key`) return refuse(ex, req, res, ERRORS.noRoute);
    if (req.method !== 'GET' && req.method !== 'HEAD') return refuse(ex, req, res, ERRORS.methodNotAllowed);
    ex.logPath = `${OWN}key`;
    const send = (body: unknown): void => {
      if (ex.closed || res.headersSent) return;
      if (body === null) return refuse(ex, req, res, ERRORS.keystoreUnavailable);
      const text = Buffer.from(JSON.stringify(body));
      ex.bytesOut = req.method === 'HEAD' ? 0 : text.length;
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': text.length, 'cache-control': 'no-store', ...(hasBody(req) ? { connection: 'close' } : {}) });
      res.end(req.method === 'HEAD' ? undefined : text);
    };
    const body = deps.keyStatus(principal, Date.now());
    // The store could not be read (a worker's, a fleet's): 503, as when keys cannot be.
    if (body instanceof Promise) void body.then(send, () => send(null));
    else send(body);
  }

  function refuseRaw(req: GatewayRequest, socket: Duplex, err: GatewayError): void {
    const ex = new Exchange(`${boot}-${(++counter).toString(36)}`, req, req.url as string);
    const keys = deps.keys();
    const who = keys === null ? 'unknown' : authenticate(ex, deps.runtime().table, keys);
    const reply = typeof who === 'string' ? ERRORS.unauthorized : err;
    if (typeof who === 'string') {
      metrics.authFailure(who);
      ex.authFailure = who;
    }
    ex.settle({ by: 'gateway', code: reply.code });
    ex.bytesOut = reply.body.length;
    writeRawError(socket as Socket, reply);
    complete(ex, reply.status, false);
  }

  return { handle, refuseRaw };
}

/**
 * A request on a route whose cost is settled after the fact: when it starts
 * a run, where its run is asked about later (a synchronous run: marked, its
 * run cannot be asked about), and the query with
 * `maxTotalChargeUsd` capped at what is left of the key's budget
 * (docs/routes.md, "Capped runs"); otherwise the query as it was.
 */
function runStart(ex: Exchange, method: string, route: Route, path: string, query: string): string {
  const prefix = runStartPrefix(method, path);
  if (prefix !== null) ex.runPath = route.basePath + prefix;
  else if (isSyncRun(method, path)) ex.syncRun = true;
  else return query;
  const left = ex.admission?.left;
  return left === undefined ? query : capParam(query, 'maxTotalChargeUsd', left);
}
