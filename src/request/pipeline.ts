// One request's way through the gateway (docs/routes.md, authentication.md, responses.md, logs.md):
//   id → auth → route → guards → rewrite → forward → completion.
// Authentication comes before routing, so an unauthenticated caller learns
// nothing about which paths exist.
import type { IncomingHttpHeaders, ServerResponse } from 'node:http';
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
import type { KeySet, Lookup, Principal } from '../keys/keyset.ts';
import { isWellFormed, redactTokens, tokenDigestBytes, TokenMemo } from '../keys/token.ts';
import { neverConnected } from './outcome.ts';
import type { AuthFailure, Metrics } from '../observe/metrics.ts';
import { askedRunCap, dropParams, withRunCap } from './query.ts';
import { matchRoute, type Credential, type Route, type RouteTable } from './routes.ts';
import type { Generation, Target } from './runtime.ts';
import type { Sweeper } from './timers.ts';
import type { Ledger } from '../ledger/ledger.ts';
import type { Admit } from '../limits/admissions.ts';
import { whenDecided, type Decision, type LimitCode, type PaidStart, type Refused } from '../limits/limiter.ts';
import { policyFor } from '../limits/policy.ts';
import { scraperCall, type ScraperCall } from './scraper-calls.ts';
import { keepReadingForRun } from './forward.ts';
import type { CredentialBoard } from './credentials.ts';
import type { Room } from '../capacity/capacity.ts';
import { allowedFrom, clientAddress, inRanges } from '../lib/addresses.ts';

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
  /** The routes' credentials set aside (docs/credentials.md). */
  readonly credentials: CredentialBoard;
  /** Room on the accounts of routes with a capacity (docs/credentials.md, "Capacity"). */
  readonly room: Room;
  /** GET /keyward/key's body for this key (views/key-status.ts): at once, or once the primary or the store answered. */
  keyStatus(principal: Principal, now: number): unknown;
}

/** A known key this version cannot serve: its rules were written by a newer keyward (503, never served without them). */
const UNSUPPORTED_KEY = Symbol('keyward.unsupported-key');
/** The gateway's own prefix on the public listener (docs/limits.md, "A key's own status"). */
const OWN_PREFIX = '/keyward/';

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
  /** What the call does with money on a route whose cost is settled after the fact (scraper-calls.ts); null elsewhere. */
  readonly call: ScraperCall;
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

/**
 * Authenticate: the key's lookup (refused or not), or why there is none.
 * Pure but for the key set's own bookkeeping and `memo`, the connection's
 * last token and its digest (keys/token.ts, TokenMemo): the same token
 * again is neither checked nor hashed again, but still looked up.
 */
export function authenticate(
  headers: IncomingHttpHeaders,
  url: string,
  table: RouteTable,
  keys: KeySet,
  now: number,
  memo: TokenMemo | null = null,
): Lookup | AuthFailure {
  const token = presentedToken(headers, url, table);
  if (token === null) return 'missing';
  let digest = memo === null ? null : memo.digestOf(token);
  if (digest === null) {
    if (!isWellFormed(token)) return 'malformed';
    digest = tokenDigestBytes(token);
    memo?.remember(token, digest);
  }
  return keys.lookupDigest(digest, now) ?? 'unknown';
}

/** Each client connection's TokenMemo, made with its first authenticated request. */
const MEMO = Symbol('keyward.tokenMemo');
type Remembering = Socket & { [MEMO]?: TokenMemo };

function memoOf(socket: Socket): TokenMemo {
  return ((socket as Remembering)[MEMO] ??= new TokenMemo());
}

/** An authenticated request routed: its route, where it goes, the path below the prefix and the query to forward. */
export interface Routed {
  readonly error: null;
  readonly route: Route;
  readonly target: Target;
  readonly path: string;
  readonly forwardQuery: string;
  /** What the call does with money on a route whose cost is settled after the fact (scraper-calls.ts); null elsewhere. */
  readonly call: ScraperCall;
}

/** Not routed: the error to answer, and the route when one matched (a guard refused). */
export interface Unrouted {
  readonly error: GatewayError;
  readonly route: Route | null;
}

/**
 * Where an authenticated request goes (docs/routes.md): the route its path
 * names, the guards the route and the key set, and the route's target.
 * Pure: the pipeline's one decision, testable without sockets.
 */
export function routeOf(rt: Generation, method: string, url: string, headers: IncomingHttpHeaders, principal: Principal): Routed | Unrouted {
  const match = matchRoute(rt.table, method, url);
  if (match.error !== null) return { error: match.error, route: null };
  const route = match.route;
  const forwardQuery = match.query === null ? '' : dropParams(match.query, route.dropQuery);
  const refusal = runGuards({ headers, route, principal, path: match.path, query: match.query, forwardQuery, maxBodyBytes: rt.config.maxBodyBytes });
  if (refusal !== null) return { error: refusal, route };
  // The route-configured guard passed, so its target exists; looked up, not assumed.
  const target = rt.targets.get(route.name);
  if (target === undefined) return { error: ERRORS.routeNotConfigured, route };
  const call = route.cost?.runs === undefined ? null : scraperCall(method, match.path);
  // Spend the gateway would never see cannot be held to a budget (docs/limits.md, "Scraper runs").
  if (call?.kind === 'later' && principal.limits?.budgets?.[route.name] !== undefined) return { error: ERRORS.budgetUnenforceable, route };
  return { error: null, route, target, path: match.path, forwardQuery, call };
}

export function createPipeline(deps: PipelineDeps): Pipeline {
  return new RequestPipeline(deps);
}

/** The steps of one request, each a method; `handle` runs them in order. */
class RequestPipeline implements Pipeline {
  readonly #deps: PipelineDeps;
  // Request ids: unique per process start, cheap to make, sortable within a process.
  readonly #boot = randomBytes(4).toString('hex');
  #counter = 0;
  /** Shared by every request (a listener per request, not a closure per request). */
  readonly #onResponseClose: (this: ServerResponse) => void;
  readonly #countChunk: (this: GatewayRequest, chunk: Buffer) => void;
  readonly #keepForReplay: (this: GatewayRequest, chunk: Buffer) => void;

  constructor(deps: PipelineDeps) {
    this.#deps = deps;
    this.#onResponseClose = responseClosed(deps);
    this.#countChunk = chunkCounter(deps);
    this.#keepForReplay = replayKeeper(deps);
  }

  handle(req: GatewayRequest, res: ServerResponse, expect: Expect): void {
    const url = req.url as string;
    const ex = new Exchange(this.#id(), req, url);
    ex.res = res;
    req.exchange = ex;
    // `on`, not `once`: a response closes once, and `once` wraps the listener anew for every request.
    res.on('close', this.#onResponseClose);
    // Pipelined behind a response that closes this connection: the client
    // will never see an answer, so nothing of it may reach (and bill) an upstream.
    if (isClosing(req.socket)) return ex.takeOver({ by: 'client', reason: 'connection_closing' });
    if (this.#deps.draining()) return this.#refuse(ex, req, res, ERRORS.shuttingDown);
    // Read once per request and passed on: read twice, a shared store's
    // staleness limit could run out in between and the second read be null.
    const keys = this.#deps.keys();
    if (keys === null) return this.#refuse(ex, req, res, ERRORS.keystoreUnavailable);
    const rt = this.#deps.runtime();
    const principal = this.#principal(ex, rt.table, keys);
    if (principal === null) return this.#refuse(ex, req, res, ERRORS.unauthorized);
    if (principal === UNSUPPORTED_KEY) return this.#refuse(ex, req, res, ERRORS.keyUnsupported);
    if (expect === 'other') return this.#refuse(ex, req, res, ERRORS.expectationFailed);
    // A key with an allowlist, from elsewhere: refused before anything is routed, forwarded or counted.
    const allowed = allowedFrom(principal);
    if (allowed !== null && !inRanges(allowed, clientAddress(ex.client ?? '', req.headers['x-forwarded-for'], rt.trustedProxies))) {
      this.#deps.metrics.limited(this.#deps.metrics.noRoute, 'address');
      return this.#refuse(ex, req, res, ERRORS.notFromHere);
    }
    if (url.startsWith(OWN_PREFIX)) return this.#own(ex, req, res, principal, url);
    const step = routeOf(rt, req.method as string, url, req.headers, principal);
    ex.route = step.route;
    if (step.error !== null) {
      if (step.error === ERRORS.forbidden && step.route !== null) this.#deps.metrics.limited(step.route.index, 'scope');
      return this.#refuse(ex, req, res, step.error);
    }
    // Before the key's limits: a request no credential can carry consumes nothing.
    if (step.route.credentials.length > 1 && this.#deps.credentials.availableCount(step.route, Date.now()) === 0)
      return this.#exhausted(ex, req, res, step.route);
    this.#askAdmission({
      ex,
      req,
      res,
      expect,
      principal,
      route: step.route,
      target: step.target,
      path: step.path,
      forwardQuery: step.forwardQuery,
      call: step.call,
    });
  }

  /** Requests Node hands over without a response object: answered on the socket, as unauthorized unless the key is good. */
  refuseRaw(req: GatewayRequest, socket: Duplex, err: GatewayError): void {
    const ex = new Exchange(this.#id(), req, req.url as string);
    const principal = this.#principal(ex, this.#deps.runtime().table, this.#deps.keys());
    const reply = principal === null ? ERRORS.unauthorized : principal === UNSUPPORTED_KEY ? ERRORS.keyUnsupported : err;
    ex.takeOver({ by: 'gateway', code: reply.code });
    ex.ownBody(reply.body.length);
    writeRawError(socket as Socket, reply);
    this.#deps.complete(ex, reply.status, false);
  }

  #id(): string {
    return `${this.#boot}-${(++this.#counter).toString(36)}`;
  }

  /**
   * The key, or null with the failure counted and recorded (the key is
   * recorded when it is known, refused or not), or UNSUPPORTED_KEY for a key
   * whose rules this version cannot enforce (docs/keys.md, "Versions").
   */
  #principal(ex: Exchange, table: RouteTable, keys: KeySet | null): Principal | null | typeof UNSUPPORTED_KEY {
    const now = Date.now();
    const found = keys === null ? 'unknown' : authenticate(ex.req.headers, ex.url, table, keys, now, memoOf(ex.req.socket));
    if (typeof found === 'string') return this.#unauthenticated(ex, found);
    ex.principal = found.principal;
    if (found.refusal === 'unsupported') return UNSUPPORTED_KEY;
    if (found.refusal !== null) return this.#unauthenticated(ex, found.refusal);
    this.#deps.lastUse.touch(found.principal.id, now);
    return found.principal;
  }

  #unauthenticated(ex: Exchange, why: AuthFailure): null {
    this.#deps.metrics.authFailure(why);
    ex.authFailure = why;
    return null;
  }

  /** A key's limits, if it has any: admitted here, or asked of the primary. A key without limits pays one property read. */
  #askAdmission(a: Admitted): void {
    const { principal, route } = a;
    const policy = principal.limits === undefined ? null : policyFor(principal);
    if (policy === null) return this.#forward(a);
    if (this.#deps.ledgerDamaged() && (policy.quota !== null || policy.budgets.has(route.name)))
      return this.#refuse(a.ex, a.req, a.res, ERRORS.ledgerUnavailable);
    // A paid start is capped and reserved at its cap; the client may ask for a lower one (docs/limits.md, "Scraper runs").
    const start: PaidStart | null = a.call === null || a.call.kind === 'later' ? null : { asked: askedRunCap(a.forwardQuery) };
    const admitted = this.#deps.admit(principal, policy, route.name, Date.now(), start);
    if (admitted.kind !== 'pending') return this.#onDecision(admitted, a);
    // A worker waits for its primary's answer (a fleet for a lease claim); the request is not read meanwhile.
    whenDecided(admitted, (r) => this.#onDecision(r, a));
  }

  #onDecision(r: Decision, a: Admitted): void {
    if (r.kind !== 'admitted') {
      if (a.ex.closed) return;
      if (r.kind === 'refused') return this.#refuseLimited(a, r);
      const err = r.code === 'ledger_unavailable' ? ERRORS.ledgerUnavailable : ERRORS.admissionUnavailable;
      return answer(a.ex, a.res, err, this.#closeAfter(a.req), { 'retry-after': r.retryAfter });
    }
    // The client left while its primary decided: the admission is given back at once.
    if (a.ex.closed) return r.done(false, 0);
    a.ex.admission = r;
    this.#forward(a);
  }

  /** The credential, then rewrite and forward. */
  #forward(a: Admitted): void {
    const { ex, req, res, route } = a;
    // Room on the route's accounts first, when it has a capacity (docs/credentials.md, "Capacity").
    if (route.capacity !== null) return this.#awaitRoom(a);
    let credential = route.credentials[0] as Credential;
    if (route.credentials.length > 1) {
      const { config } = this.#deps.runtime();
      // Chosen after admission (a worker may have waited for its primary meanwhile).
      const chosen = this.#deps.credentials.choose(route, config.credentialOrder, null, Date.now());
      if (chosen === null) return this.#exhausted(ex, req, res, route);
      this.#deps.credentials.take(route, chosen);
      credential = chosen;
      this.#keepForAnother(a, config.replayMaxBodyBytes);
    }
    this.#send(a, credential);
  }

  /**
   * A route with several credentials keeps the request's body (up to a
   * bound) to send it again on another after a 401, 402 or 429
   * (docs/credentials.md, "Retry on another credential").
   */
  #keepForAnother(a: Admitted, max: number): void {
    if (a.route.credentials.length > 1) a.ex.replay = replayable(a.req, max) ? [] : null;
  }

  /**
   * A route with a capacity: the request takes a credential with room, or
   * waits in the route's queue, unread (its body stays in the socket; a
   * client expecting 100 Continue is not told to send it), or is answered
   * 503 upstream_busy. Its key's admission is held meanwhile.
   */
  #awaitRoom(a: Admitted): void {
    const { ex, route } = a;
    const room = this.#deps.room;
    const ticket = room.ask(route.name, a.principal.id, false, (label, retryAfter, waitedMs) => {
      ex.ticket = null;
      if (waitedMs >= 0) ex.queuedMs = waitedMs;
      if (label === 0) return this.#busy(a, retryAfter);
      // Granted as the client left (a worker's answer crossing its cancel): the room goes back.
      if (ex.closed) return room.release(route.name, label);
      ex.roomOn = label;
      this.#keepForAnother(a, this.#deps.runtime().config.replayMaxBodyBytes);
      this.#send(a, route.credentials[label - 1] as Credential);
    });
    if (ticket !== null) ex.ticket = ticket;
  }

  /** 503 upstream_busy: no room in time, or the queue full; nothing forwarded, nothing counted against the key. */
  #busy({ ex, req, res }: Admitted, retryAfter: number): void {
    if (ex.closed) return;
    answer(ex, res, ERRORS.upstreamBusy, this.#closeAfter(req), { 'retry-after': Math.max(1, retryAfter) });
  }

  /** Rewrite and forward on `credential`. */
  #send({ ex, req, res, expect, route, target, path, forwardQuery, call }: Admitted, credential: Credential): void {
    ex.sendWith(credential);
    // A scraper run-start: its run is settled later, and a key with a budget here has the run capped at what its admission reserved.
    if (call !== null) forwardQuery = paidStart(ex, route, call, forwardQuery);
    const suffix = forwardQuery === '' ? path : `${path}?${forwardQuery}`;
    ex.logPath = redactTokens(route.prefix + suffix.slice(1));
    req.url = route.basePath + suffix;
    // http-proxy-3 copies req.headers into the upstream request, whatever their declared type.
    req.headers = upstreamRequestHeaders(req.headers, route, credential.header) as typeof req.headers;
    if (expect === 'continue') res.writeContinue();
    this.#deps.metrics.inFlight(route.index, 1);
    this.#deps.sweeper.track(ex);
    target.forwarder.forward(req, res, ex);
    if (req.headers['transfer-encoding'] !== undefined) {
      ex.bytesIn = 0;
      req.on('data', this.#countChunk);
    }
    if (ex.replay !== null && hasBody(req)) req.on('data', this.#keepForReplay);
  }

  /**
   * Whether a refusal closes the connection after it: a request with a body
   * the gateway will not read (its bytes would be taken for the next
   * request), or any request while draining.
   */
  #closeAfter(req: GatewayRequest): boolean {
    return hasBody(req) || this.#deps.draining();
  }

  /** 503: every credential of the route is set aside (docs/credentials.md, "None available"). */
  #exhausted(ex: Exchange, req: GatewayRequest, res: ServerResponse, route: Route): void {
    this.#deps.metrics.credentialsExhausted(route.index);
    const wait = this.#deps.credentials.retryAfter(route, Date.now());
    answer(ex, res, ERRORS.credentialsExhausted, this.#closeAfter(req), wait === null ? null : { 'retry-after': wait });
  }

  /**
   * The gateway's own paths: `GET /keyward/key`, the key's own status. Never
   * forwarded, never counted against the key's limits, never refused by them.
   */
  #own(ex: Exchange, req: GatewayRequest, res: ServerResponse, principal: Principal, url: string): void {
    const q = url.indexOf('?');
    if ((q < 0 ? url : url.slice(0, q)) !== `${OWN_PREFIX}key`) return this.#refuse(ex, req, res, ERRORS.noRoute);
    if (req.method !== 'GET' && req.method !== 'HEAD') return this.#refuse(ex, req, res, ERRORS.methodNotOnRoute);
    ex.logPath = `${OWN_PREFIX}key`;
    const send = (body: unknown): void => {
      if (ex.closed || res.headersSent) return;
      if (body === null) return this.#refuse(ex, req, res, ERRORS.keystoreUnavailable);
      const text = Buffer.from(JSON.stringify(body));
      ex.ownBody(req.method === 'HEAD' ? 0 : text.length);
      res.writeHead(200, {
        'content-type': 'application/json',
        'content-length': text.length,
        'cache-control': 'no-store',
        ...(hasBody(req) ? { connection: 'close' } : {}),
      });
      res.end(req.method === 'HEAD' ? undefined : text);
    };
    const body = this.#deps.keyStatus(principal, Date.now());
    // The store could not be read (a worker's, a fleet's): 503, as when keys cannot be.
    if (body instanceof Promise) void body.then(send, () => send(null));
    else send(body);
  }

  #refuse(ex: Exchange, req: GatewayRequest, res: ServerResponse, err: GatewayError): void {
    // An unread body is still on the wire: close rather than parse it as the next request.
    answer(ex, res, err, this.#closeAfter(req));
  }

  /** 429 from a key's limits: nothing forwarded, nothing consumed; counted in the ledger and the metrics. */
  #refuseLimited({ ex, req, res, principal, route }: Admitted, r: Refused): void {
    this.#deps.metrics.limited(route.index, LIMIT_METRIC[r.code]);
    this.#deps.ledger.limited(principal.id, route.name);
    const headers: Record<string, string | number> = { 'retry-after': r.retryAfter, 'ratelimit-reset': r.reset };
    if (r.limit !== null) headers['ratelimit-limit'] = r.limit;
    if (r.remaining !== null) headers['ratelimit-remaining'] = r.remaining;
    if (r.policy !== null) headers['ratelimit-policy'] = r.policy;
    const err = limitRefusal(LIMIT_ERRORS[r.code], r.detail, route.cost?.unit ?? 'usd');
    answer(ex, res, err, this.#closeAfter(req), headers);
  }
}

/** The response's `close`: the exchange ends (completion, the admission's slot back, an unfinished upload's upstream request ended). */
function responseClosed({ sweeper, complete, credentials, room }: PipelineDeps): (this: ServerResponse) => void {
  const end = (ex: Exchange, status: number | null, aborted: boolean): void => {
    if (ex.forwardStart > 0) sweeper.untrack(ex);
    // Out of the queue, holding nothing; or the room it held goes to the next waiting.
    if (ex.ticket !== null && ex.route !== null) room.cancel(ex.route.name, ex.ticket);
    ex.ticket = null;
    if (ex.roomOn > 0 && ex.route !== null) room.release(ex.route.name, ex.roomOn);
    else if (ex.route !== null && ex.credential !== null && ex.route.credentials.length > 1) credentials.give(ex.route, ex.credential);
    ex.roomOn = 0;
    complete(ex, status, aborted);
    // In the same tick as the ledger's count: the slot comes back, and what
    // was reserved becomes what was counted (or comes back, if the request
    // never reached the upstream).
    ex.admission?.done(ex.forwardStart > 0 && !neverConnected(ex.failure), ex.costReported ? ex.cost : null);
  };
  return function onResponseClose(this: ServerResponse): void {
    const req = this.req;
    const ex = exchangeOf(req);
    ex.closed = true;
    // A run-start sent whole whose answer has not come: read by the gateway
    // itself, then ended (forward.ts); the upstream timers still run.
    if (ex.runPath !== null && req.complete && ex.proxyReq !== null && ex.ttfbMs < 0 && ex.failure === null && !ex.takenOver) {
      keepReadingForRun(ex, () => end(ex, ex.proxyRes?.statusCode ?? null, true));
      return;
    }
    // The client left (or the answer is complete) with its upload unfinished:
    // the upstream request must end too, whatever state the response is in,
    // or its socket stays open until the upstream gives up.
    if (!req.complete && ex.proxyReq !== null && !ex.proxyReq.destroyed) ex.proxyReq.destroy();
    end(ex, this.headersSent ? this.statusCode : null, !this.writableFinished);
  };
}

/**
 * Whether a request on a route with several credentials can be sent again
 * whole: no body, or a declared or chunked one, kept while it stays within
 * KEYWARD_REPLAY_MAX_BODY (docs/credentials.md, "Retry"). A larger declared
 * body is never kept.
 */
function replayable(req: GatewayRequest, max: number): boolean {
  const cl = req.headers['content-length'];
  return cl === undefined || Number(cl) <= max;
}

/** Keeps a body's chunks as they pass, so it can be sent again byte for byte; gives up past the limit. */
function replayKeeper(deps: PipelineDeps): (this: GatewayRequest, chunk: Buffer) => void {
  return function keepForReplay(this: GatewayRequest, chunk: Buffer): void {
    const ex = exchangeOf(this);
    if (ex.replay === null) return;
    ex.replayBytes += chunk.length;
    if (ex.replayBytes > deps.runtime().config.replayMaxBodyBytes) {
      ex.replay = null;
      this.removeListener('data', keepForReplay);
      return;
    }
    ex.replay.push(chunk);
  };
}

/** Counts chunked bodies (whose size is not known up front) and enforces the limit on them. */
function chunkCounter(deps: PipelineDeps): (this: GatewayRequest, chunk: Buffer) => void {
  return function countChunk(this: GatewayRequest, chunk: Buffer): void {
    const ex = exchangeOf(this);
    if (ex.takenOver) return;
    ex.bytesIn += chunk.length;
    if (ex.bytesIn <= deps.runtime().config.maxBodyBytes) return;
    ex.proxyReq?.destroy();
    this.unpipe();
    if (ex.res !== null) answer(ex, ex.res, ERRORS.payloadTooLarge, true);
  };
}

/**
 * A paid start on a route whose cost is settled after the fact: where its
 * run is asked about later (a synchronous run: marked, its run cannot be
 * asked about), and the query with the run capped at what its admission
 * reserved (docs/routes.md, "Capped runs"); otherwise the query as it was.
 */
function paidStart(ex: Exchange, route: Route, call: NonNullable<ScraperCall>, query: string): string {
  if (call.kind === 'start') ex.runPath = route.basePath + call.prefix;
  else if (call.kind === 'sync') ex.syncRun = true;
  else return query;
  const cap = ex.admission?.cap;
  return cap === undefined ? query : withRunCap(query, cap);
}
