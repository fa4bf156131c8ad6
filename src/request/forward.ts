// The only importer of http-proxy-3. It owns the upstream agents, the
// upstream timers and the translation of upstream failures, so the rest of
// the gateway never sees the library's quirks:
// - `proxyReq` is not emitted for requests carrying `Expect`, so nothing here
//   relies on it for credentials: the pipeline rewrites `req.headers` before
//   the library copies them, and strips `Expect` (the gateway answers it).
// - its `deleteLength` pass turns a chunked DELETE/OPTIONS into
//   `content-length: 0` while still piping the body, which a keep-alive
//   upstream reads as a second request (GHSA-ggv3-7p47-pfv8): removed.
// - it re-parses the request URL with WHATWG URL (which rewrites `\`, `%2e`,
//   `{}` …): `toProxy` makes it take `req.url` verbatim instead.
// - `proxyTimeout` surfaces as a reset; the gateway runs its own timers
//   (timers.ts) and marks the error, so 504 and 502 stay apart.
// - it only destroys the upstream request when the *response* was cut short;
//   a client that leaves after an early answer, with its upload unfinished,
//   is handled by the pipeline's completion hook.
// - Node relays a `101` that lacks an `Upgrade` header as a final response and
//   pools its socket; with one, it emits `upgrade` and hands the socket over.
//   Either way the gateway answers 502 and destroys that socket: it is in an
//   unknown protocol state, and the next request on it could be another
//   client's, carrying the master credential.
import type http from 'node:http';
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { rootCertificates } from 'node:tls';
import { freeSockets, upstreamAgent } from './agent.ts';
import type { Duplex } from 'node:stream';
import { ProxyServer } from 'http-proxy-3';
import { maskHeaders, type SecretForm, type Secrets } from './egress.ts';
import { asideUntil, isAsideStatus, type AsideStatus, type CredentialBoard, type CredentialSettings } from './credentials.ts';
import { peek, replay, unauthorizedOf } from './unauthorized.ts';
import { Readable } from 'node:stream';
import { ERRORS, UPSTREAM_ANSWERS, upstreamReason, type UpstreamReason } from './errors.ts';
import { exchangeOf, type Exchange, type GatewayRequest } from './exchange.ts';
import { downstreamResponseHeaders } from './headers.ts';
import { upstream } from './outcome.ts';
import { readCost, RunReader, type BodyWatch } from './cost.ts';
import { type DecodeLimits, decodersFor, relayCompressed, relayPlain } from './relay.ts';

import { answer } from './reply.ts';
import type { Credential, Route, Unauthorized } from './routes.ts';
import type { Expiry } from './timers.ts';
import type { Room } from '../capacity/capacity.ts';

export interface ForwardOptions extends DecodeLimits, CredentialSettings {
  readonly connectTimeoutMs: number;
  /** Extra PEM CAs for upstream TLS, added to the system's roots. */
  readonly upstreamCa: string | null;
  readonly upstreamIdleMs: number;
  readonly upstreamMaxHeaderBytes: number;
}

type ErrorWithCode = Error & { code?: string };

function markedError(code: string, message: string): ErrorWithCode {
  const err: ErrorWithCode = new Error(message);
  err.code = code;
  return err;
}

/** The shared sweep found a timeout for this exchange (timers.ts); act on it. */
export function expire(ex: Exchange, what: Expiry): void {
  const res = ex.webRes;
  switch (what) {
    case 'answer':
    case 'upload-stalled':
      if (ex.proxyReq !== null) {
        ex.proxyReq.destroy(markedError('KEYWARD_UPSTREAM_TIMEOUT', 'upstream did not answer in time')); // → onError: 504
        return;
      }
      upstreamFailed(ex, res, 'timeout', 'KEYWARD_UPSTREAM_TIMEOUT', true);
      return;
    case 'request-idle':
      // The client's body stalled: the upstream must not wait (and bill) for
      // it. Answered first, so the upstream's reset that follows is ignored.
      answer(ex, res, ERRORS.requestTimeout, true);
      ex.proxyReq?.destroy();
      ex.req.unpipe();
      return;
    case 'response-idle':
      // The status is out: closing the connection is the only signal left.
      ex.fail(res.writableNeedDrain ? { by: 'client', reason: 'idle' } : upstream('idle'));
      ex.proxyReq?.destroy();
      res.destroy();
      return;
  }
}

function onProxyReq(proxyReq: http.ClientRequest, req: http.IncomingMessage, res: ServerResponse): void {
  const ex = exchangeOf(req);
  ex.proxyReq = proxyReq;
  if (ex.takenOver || ex.closed) {
    proxyReq.destroy();
    return;
  }

  // Only a listener stops Node from destroying the socket silently (and the
  // client waiting for an answer that never comes).
  proxyReq.on('upgrade', (_proxyRes: http.IncomingMessage, socket: Duplex) => {
    socket.destroy();
    unexpectedSwitch(ex, res);
  });
}

/**
 * http-proxy-3 destroys the upstream request whenever the client's response
 * closes unfinished (its `res` close listener, web-incoming.ts). A run-start
 * sent whole must be read to its end instead, or the run it started is never
 * recorded, settled or counted (docs/limits.md, "Scraper runs"). Called by
 * the pipeline's own close listener, which runs before the library's: that
 * one destroy is let pass; every other, ours with a reason or a later one,
 * goes through. Installed only then, so no other request's upstream request
 * is touched.
 */
export function keepReadingForRun(ex: Exchange, end: () => void): void {
  const proxyReq = ex.proxyReq as http.ClientRequest;
  const destroy = proxyReq.destroy.bind(proxyReq);
  let kept = false;
  ex.afterRun = end;
  proxyReq.destroy = (err?: Error): http.ClientRequest => {
    if (err === undefined && ex.afterRun !== null && !kept) {
      kept = true;
      return proxyReq;
    }
    return destroy(err);
  };
}

/**
 * The answer to a run-start whose client left: read here (a run object is
 * small; RunReader bounds what it keeps), then the exchange ends with the
 * run it named, or none if the answer failed or was no run object.
 */
function readForRun(ex: Exchange, proxyRes: http.IncomingMessage): void {
  const end = ex.afterRun as () => void;
  ex.proxyRes = proxyRes;
  const status = proxyRes.statusCode ?? 0;
  const reader = status >= 200 && status < 300 && proxyRes.headers['content-encoding'] === undefined ? new RunReader() : null;
  let over = false;
  const finish = (): void => {
    if (over) return;
    over = true;
    ex.afterRun = null;
    if (reader !== null && proxyRes.complete) {
      reader.end();
      ex.runStarted(reader.run);
    }
    end();
  };
  if (reader !== null) proxyRes.on('data', (chunk: Buffer) => reader.push(chunk));
  else proxyRes.resume();
  proxyRes.on('end', finish);
  proxyRes.on('close', finish);
  proxyRes.on('error', finish);
}

/** A run-start whose client left and whose upstream request failed: it ends with no run named. */
function runLost(ex: Exchange): boolean {
  const end = ex.afterRun;
  if (end === null) return false;
  ex.afterRun = null;
  ex.proxyReq?.destroy();
  end();
  return true;
}

function unexpectedSwitch(ex: Exchange, res: ServerResponse): void {
  ex.ttfbMs = performance.now() - ex.forwardStart;
  if (ex.takenOver || ex.closed) return;
  upstreamFailed(ex, res, 'unexpected_101', null, !ex.req.complete);
}

/** The upstream failed before anything of its response went: recorded (its reason for the log and metrics) and answered from the one mapping. */
function upstreamFailed(ex: Exchange, res: ServerResponse, reason: UpstreamReason, detail: string | null, close: boolean): void {
  ex.fail(upstream(reason, detail));
  answer(ex, res, UPSTREAM_ANSWERS[reason], close);
}

/** Statuses and methods whose response has no body (RFC 9110 §6.4.1): stray bytes after the head are not theirs. */
const bodiless = (status: number, method: string | undefined): boolean => status === 204 || status === 304 || method === 'HEAD';

/**
 * `refused`: true when the answer refused its credential (set aside as
 * `aside`) and the request went again on another (credentials.ts); this
 * answer is then not the client's.
 */
type Refused = (ex: Exchange, proxyRes: http.IncomingMessage, aside: AsideStatus) => boolean;

function onProxyRes(
  proxyRes: http.IncomingMessage,
  req: http.IncomingMessage,
  res: ServerResponse,
  secrets: Secrets,
  limits: DecodeLimits,
  refused: Refused,
): void {
  const ex = exchangeOf(req);
  ex.ttfbMs = performance.now() - ex.forwardStart;
  const status = proxyRes.statusCode;
  const route = ex.route;
  if (isAsideStatus(status) && route !== null && ex.credential !== null && route.credentials.length > 1) {
    if (status === 401 && route.unauthorized !== null) {
      // Whether the account or only the call is refused is in the body
      // (routes.ts, `unauthorized`): its first bytes are read first.
      void peek(proxyRes)
        .then(async (peeked) => {
          const said = await unauthorizedOf(route, proxyRes, peeked).catch((): Unauthorized => 'call');
          if (said !== 'call' && refused(ex, proxyRes, said === 'payment' ? 402 : 401)) return;
          relayAnswer(replay(proxyRes, peeked), req, res, secrets, limits);
        })
        .catch((err: unknown) => onError(err as ErrorWithCode, req, res, () => undefined));
      return;
    }
    if (refused(ex, proxyRes, status)) return;
  }
  relayAnswer(proxyRes, req, res, secrets, limits);
}

/** The upstream's answer to the client: its head filtered and masked, its body through the relay. */
function relayAnswer(proxyRes: http.IncomingMessage, req: http.IncomingMessage, res: ServerResponse, secrets: Secrets, limits: DecodeLimits): void {
  const ex = exchangeOf(req);
  if (ex.afterRun !== null) return readForRun(ex, proxyRes);
  if (ex.takenOver || ex.closed || res.headersSent) {
    proxyRes.destroy();
    return;
  }
  if (proxyRes.statusCode === 101) {
    // Not pooled again: the connection's protocol is unknown from here on.
    proxyRes.socket.destroy();
    unexpectedSwitch(ex, res);
    return;
  }
  const decoders = decodersFor(secrets.empty ? undefined : proxyRes.headers['content-encoding']);
  const transfer = unscannableTransfer(proxyRes, secrets);
  if (decoders === null || transfer) {
    // A coding the filter cannot read could carry a secret past it.
    upstreamFailed(ex, res, 'unscannable_encoding', transfer ? 'transfer_coding' : null, true);
    proxyRes.destroy();
    return;
  }
  ex.bodiless = bodiless(proxyRes.statusCode as number, req.method);
  ex.proxyRes = proxyRes;
  closeOnAbort(ex, proxyRes, res);
  const headers = downstreamResponseHeaders(proxyRes.rawHeaders);
  const inHeaders = maskHeaders(secrets, headers);
  if (inHeaders !== null) ex.masked = inHeaders;
  const watch = bodyWatch(ex, proxyRes, secrets, decoders.list.length > 0);
  if (decoders.list.length === 0) {
    // After the rest of this parse: stray bytes behind a complete response
    // fail the upstream request in the same tick (onError), and the client
    // must then be told the connection closes after this response.
    queueMicrotask(() => {
      if (!ex.takenOver && !ex.closed && writeHead(ex, res, proxyRes, headers)) relayPlain({ proxyRes, res, ex, secrets, limits, onSecret, watch });
    });
    return;
  }
  const head = (): boolean => writeHead(ex, res, proxyRes, headers);
  // A compressed body's head waits for its first clean decoded bytes: one
  // that does not decode gets a 502, not a 200 and a cut.
  relayCompressed({
    proxyRes,
    res,
    ex,
    secrets,
    limits,
    onSecret,
    watch,
    decoders,
    head,
    undecodable: () => answer(ex, res, UPSTREAM_ANSWERS.unscannable_encoding, true),
    sniffed: null,
  });
}

/**
 * A transfer coding other than chunked (`gzip, chunked`) is left on the body
 * by Node's parser and labelled nowhere a client would decode it from: bytes
 * the filter cannot read (RFC 9112 §6.1).
 */
function unscannableTransfer(proxyRes: http.IncomingMessage, secrets: Secrets): boolean {
  const te = proxyRes.headers['transfer-encoding'];
  return !secrets.empty && te !== undefined && te.trim().toLowerCase() !== 'chunked';
}

function ignore(): void {}

/** An upstream that dies mid-body: the status is already out, so the only honest signal left is to close the client's connection at once. */
function closeOnAbort(ex: Exchange, proxyRes: http.IncomingMessage, res: ServerResponse): void {
  proxyRes.on('error', ignore);
  // `on`, not `once`: a response closes once, and `once` wraps the listener anew.
  proxyRes.on('close', () => {
    if (!proxyRes.complete && !ex.closed && !ex.bodiless) {
      ex.fail(upstream('aborted'));
      res.destroy();
    }
  });
}

/** The response head to the client; false (and a 502) for a header Node refuses to write. */
function writeHead(ex: Exchange, res: ServerResponse, proxyRes: http.IncomingMessage, headers: string[]): boolean {
  try {
    // The status's standard reason phrase, never the upstream's: a phrase is
    // free text an upstream could put a secret in (`200 apify_api_…`), and
    // no HTTP client gives it meaning (RFC 9112 §4).
    res.writeHead(proxyRes.statusCode as number, headers);
    return true;
  } catch {
    // A header Node refuses to write (control characters from the upstream).
    upstreamFailed(ex, res, 'invalid_response', null, true);
    proxyRes.socket.destroy();
    return false;
  }
}

/** The cost in a header is taken now; the reader for one in the body (or a run-start's run object) is returned. */
function bodyWatch(ex: Exchange, proxyRes: http.IncomingMessage, secrets: Secrets, compressed: boolean): BodyWatch | null {
  const reported = readCost(ex.route?.cost ?? null, ex.bodiless, proxyRes.headers, secrets.empty);
  if (reported.header !== null) {
    ex.costIs(reported.header.value, reported.header.bad, reported.header.seen);
    // A key's first budgeted call: its overlapping calls need not wait for the end of a stream.
    ex.admission?.costKnown?.(ex.cost);
  }
  // A scraper run-start's run object, read as it passes (the filter reads a compressed one decoded).
  const status = proxyRes.statusCode ?? 0;
  const run = ex.runPath !== null && status >= 200 && status < 300 && !ex.bodiless && !(secrets.empty && compressed);
  return run ? new RunReader() : reported.body;
}

/** Secrets found in a body: masked (plain), or the response cut (compressed). */
function onSecret(ex: Exchange, found: readonly SecretForm[], cut: boolean): void {
  ex.masked = ex.masked === null ? found : [...new Set([...ex.masked, ...found])];
  if (cut) ex.fail(upstream('secret_in_compressed_body'));
}

/** Failures of a reused pooled connection that mean "closed while idle", not "the upstream broke". */
const STALE_CONNECTION = new Set(['ECONNRESET', 'EPIPE', 'ECONNABORTED']);

/**
 * A GET or HEAD without a body whose reused connection failed before any
 * response byte: the upstream closed it while it sat in the pool, and never
 * saw the request. Safe to send once more on a fresh connection. Never a
 * request with a body (these upstreams bill per call) and never twice.
 */
function retriable(err: ErrorWithCode, ex: Exchange): boolean {
  const req = ex.req;
  return (
    !ex.retried &&
    ex.ttfbMs < 0 &&
    ex.proxyReq?.reusedSocket === true &&
    STALE_CONNECTION.has(err.code ?? '') &&
    (req.method === 'GET' || req.method === 'HEAD') &&
    req.headers['transfer-encoding'] === undefined &&
    (req.headers['content-length'] === undefined || req.headers['content-length'] === '0')
  );
}

function onError(err: ErrorWithCode, req: http.IncomingMessage, resOrSocket: ServerResponse | Socket, retry: (ex: Exchange) => void): void {
  const ex = exchangeOf(req);
  if (runLost(ex)) return;
  // A fully read request is auto-destroyed, so `req.destroyed` says nothing
  // about the client; its socket does.
  if (ex.takenOver || ex.closed || req.socket.destroyed) {
    ex.proxyReq?.destroy();
    return;
  }
  // Only `web` requests are forwarded: never a socket here.
  const res = resOrSocket as ServerResponse;
  if (ex.proxyRes?.complete === true) {
    // The response was complete (a 204, 304 or HEAD, or a body as long as
    // its Content-Length); what failed was the bytes after it, which Node's
    // parser took for a next response. The upstream connection is gone
    // (never pooled again); the response is relayed whole, and the client's
    // connection closes after it, since what came next is unknown.
    if (!res.headersSent) res.shouldKeepAlive = false;
    else if (ex.bodiless && !res.writableEnded) res.end();
    return;
  }
  if (retriable(err, ex)) {
    retry(ex);
    return;
  }
  const reason = upstreamReason(err.code);
  if (res.headersSent) {
    ex.fail(upstream(reason, err.code ?? null));
    res.destroy();
    return;
  }
  upstreamFailed(ex, res, reason, err.code ?? null, !req.complete);
}

export class Forwarder {
  readonly #proxy: ProxyServer;
  readonly #agent: http.Agent;
  readonly #onError: (err: ErrorWithCode, req: http.IncomingMessage, res: ServerResponse | Socket) => void;

  readonly #board: CredentialBoard;
  readonly #room: Room;
  readonly #settings: CredentialSettings;

  /**
   * `secrets`: the secrets sent to this route's upstream origin, with their
   * scan tables (built once per configuration and origin, shared by the
   * routes on it; egress.ts, secretsByOrigin); `board`: the gateway's
   * credentials set aside; `room`: room on the accounts of a route with a
   * capacity (capacity/capacity.ts).
   */
  constructor(route: Route, options: ForwardOptions, secrets: Secrets, board: CredentialBoard, room: Room) {
    this.#board = board;
    this.#room = room;
    this.#settings = options;
    this.#agent = upstreamAgent(route.target, options);
    this.#proxy = new ProxyServer({
      target: route.target,
      agent: this.#agent,
      // Host header and TLS SNI are the upstream's own.
      changeOrigin: true,
      // Take req.url as it is (see the header comment).
      toProxy: true,
      selfHandleResponse: true,
      xfwd: false,
      // Verification is always on; a private CA is added to the roots, never instead of verification.
      secure: true,
      // (typed as one string; Node's TLS takes a list, and http-proxy-3 passes it through as is)
      ...(options.upstreamCa === null ? {} : { ca: [...rootCertificates, options.upstreamCa] as unknown as string }),
      connectTimeout: options.connectTimeoutMs,
    });
    // Not part of the typed API, but the documented way the library composes
    // its passes: drop the one that breaks request framing.
    const internals = this.#proxy as unknown as { webPasses: Array<{ name: string }> };
    internals.webPasses = internals.webPasses.filter((pass) => pass.name !== 'deleteLength');
    this.#proxy.on('proxyReq', onProxyReq);
    const refused: Refused = (ex, proxyRes, aside) => this.#refused(ex, proxyRes, aside);
    this.#proxy.on('proxyRes', (proxyRes, req, res) => onProxyRes(proxyRes, req, res, secrets, options, refused));
    const retry = (ex: Exchange): void => {
      // The other idle connections are at least as old: drop them too, so the retry opens a fresh one.
      this.#dropIdle();
      ex.retried = true;
      ex.proxyReq = null;
      this.forward(ex.req, ex.webRes, ex);
    };
    this.#onError = (err, req, res) => onError(err, req, res, retry);
    // Every call passes its own callback, so this never fires; it is here so
    // that a library change can never turn an upstream failure into a crash.
    this.#proxy.on('error', (err, req, res) => this.#onError(err, req, res));
  }

  /** Send the (already rewritten) request upstream and stream the answer back. */
  forward(req: GatewayRequest, res: ServerResponse, ex: Exchange): void {
    ex.forwardStart = performance.now();
    this.#proxy.web(req, res, this.#onError);
  }

  /**
   * An answer of 401, 402 or 429 on a route with several credentials
   * (docs/credentials.md): the credential is set aside (as `aside`: a 401
   * whose body says the account is out of credit is a 402), decided before
   * any byte of this answer reaches the client; then, when the
   * request can be sent again whole and another credential is available, it
   * goes again byte for byte on that one, and this answer is read away (its
   * connection stays pooled). The client's deadlines run on: `answerSince`
   * is kept, so the answer timeout spans every try.
   */
  #refused(ex: Exchange, proxyRes: http.IncomingMessage, aside: AsideStatus): boolean {
    const route = ex.route as Route;
    const used = ex.credential as Credential;
    const status = proxyRes.statusCode as number;
    const now = Date.now();
    this.#board.setAside({
      route: route.name,
      label: used.label,
      status: aside,
      until: asideUntil(aside, proxyRes.headers['retry-after'], now, this.#settings),
    });
    const refusedBy = (ex.refusedBy ??= []);
    refusedBy.push(`${used.label}:${status}`);
    // A body not read in full (or past the replay limit) cannot be sent again; nor a request nobody waits for.
    if (ex.replay === null || !ex.req.complete || ex.afterRun !== null || ex.takenOver || ex.closed) return false;
    const tried = new Set(refusedBy.map((t) => Number(t.slice(0, t.indexOf(':')))));
    if (route.capacity !== null) return this.#againWhenRoom(ex, proxyRes, used, status as AsideStatus);
    const next = this.#board.choose(route, this.#settings.credentialOrder, tried, now);
    if (next === null) return false;
    proxyRes.resume();
    this.#board.give(route, used);
    this.#board.take(route, next);
    this.#again(ex, used, next, status as AsideStatus);
    return true;
  }

  /**
   * On a route with a capacity: the refused credential's room goes back and
   * the request asks for room again, first among its key's waiting (the
   * refused credential is set aside, so it is not chosen); it goes when a
   * credential has room, or is answered 503 upstream_busy.
   */
  #againWhenRoom(ex: Exchange, proxyRes: http.IncomingMessage, used: Credential, status: AsideStatus): boolean {
    const route = ex.route as Route;
    proxyRes.resume();
    this.#forgetRefused(ex);
    this.#room.release(route.name, used.label);
    ex.roomOn = 0;
    const ticket = this.#room.ask(route.name, ex.principal?.id ?? '', true, (label, retryAfter, waitedMs) => {
      ex.ticket = null;
      if (waitedMs >= 0) ex.queuedMs = Math.max(0, ex.queuedMs) + waitedMs;
      if (ex.closed) return label === 0 ? undefined : this.#room.release(route.name, label);
      if (label === 0) return answer(ex, ex.webRes, ERRORS.upstreamBusy, false, { 'retry-after': Math.max(1, retryAfter) });
      ex.roomOn = label;
      this.#again(ex, used, route.credentials[label - 1] as Credential, status);
    });
    if (ticket !== null) ex.ticket = ticket;
    return true;
  }

  /** The refused exchange is over: a late failure of its connection is not this request's. */
  #forgetRefused(ex: Exchange): void {
    const old = ex.proxyReq;
    old?.removeAllListeners('error');
    old?.on('error', ignore);
    ex.proxyReq = null;
  }

  /** Send the request again, byte for byte, on `next`. */
  #again(ex: Exchange, used: Credential, next: Credential, status: AsideStatus): void {
    const route = ex.route as Route;
    this.#board.retried({ route, status, from: used.label, to: next.label });
    ex.sendWith(next);
    ex.req.headers[next.header[0]] = next.header[1];
    ex.ttfbMs = -1;
    this.#forgetRefused(ex);
    const body = ex.replay === null || ex.replay.length === 0 ? {} : { buffer: Readable.from(ex.replay, { objectMode: false }) };
    this.#proxy.web(ex.req, ex.webRes, body, this.#onError);
  }

  #dropIdle(): void {
    for (const socket of freeSockets(this.#agent)) socket.destroy();
  }

  /**
   * After a reload: requests in flight finish on this forwarder, but no
   * socket goes back to its pool (Node's agent destroys a freed socket when
   * keepAlive is off), and the idle ones close now.
   */
  retire(): void {
    (this.#agent as unknown as { keepAlive: boolean }).keepAlive = false;
    this.#dropIdle();
  }

  close(): void {
    this.#agent.destroy();
  }
}
