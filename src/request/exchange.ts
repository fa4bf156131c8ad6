// Per-request state, carried on the request object itself so every event
// handler (pipeline, forwarder, sweeper, completion) reads the same fields
// without a lookup. One class with all fields set in the constructor keeps
// V8's object shape stable on the hot path. A field more than one module
// writes is private, with one method that writes it (`costIs`, `relayed`,
// `ownBody`, `sendWith`, `runStarted`, `fail`, `takeOver`), so each has one
// writer to read when it is wrong.
import { IncomingMessage, type ClientRequest, type ServerResponse } from 'node:http';
import type { SecretForm } from './egress.ts';
import type { Principal } from '../keys/keyset.ts';
import type { AuthFailure } from '../observe/metrics.ts';
import type { Failure } from './outcome.ts';
import type { Admission } from '../limits/limiter.ts';
import type { Credential, Route } from './routes.ts';

export class Exchange {
  readonly id: string;
  readonly start: number;
  readonly req: GatewayRequest;
  /** The client's address, read now: a destroyed socket no longer knows it (Node caches it per connection). */
  readonly client: string | null;
  /** Null for upgrades and CONNECT, which Node hands over as a bare socket. */
  res: ServerResponse | null = null;
  /** The key the token named, also when it was refused (revoked, expired, out of scope). */
  principal: Principal | null = null;
  /** Why the token was refused with 401, for the log line (never the token). */
  authFailure: AuthFailure | null = null;
  route: Route | null = null;
  /** The path as logged: credential parameters and anything token-shaped removed. */
  logPath: string | null = null;
  /** Request body bytes counted for chunked requests; -1 when the Content-Length says it. */
  bytesIn = -1;
  #bytesOut = 0;
  forwardStart = 0;
  ttfbMs = -1;
  proxyReq: ClientRequest | null = null;
  /** Sweeper state: bytes moved on both connections at the last sweep, and when that last changed. */
  activity = 0;
  lastActive = 0;
  /** Its place in the sweeper's list while it is watched; -1 when not (timers.ts). */
  sweepSlot = -1;
  /** When the request was found fully sent upstream (the answer timeout runs from here); 0 before. */
  answerSince = 0;
  /** Why the request did not end as the upstream's whole answer; set once (outcome.ts). */
  failure: Failure | null = null;
  /** The gateway answered this request itself (or dropped it): later upstream events are ignored. */
  takenOver = false;
  /** The client response closed (normally or not). */
  closed = false;
  /** The upstream's response has no body (204, 304, HEAD): bytes after its head are not relayed. */
  bodiless = false;
  /** The upstream's response, once its head arrived: whether it was complete when its connection failed. */
  proxyRes: IncomingMessage | null = null;
  /** Sent again after a reused upstream connection failed (forward.ts); never twice. */
  retried = false;
  #credential: Credential | null = null;
  /** Credentials refused on the way, `label:status` each, for the log line; null when the first one answered. */
  refusedBy: string[] | null = null;
  /**
   * The request's body as read so far, kept so that it can be sent again on
   * another credential (a route with several, a body within
   * KEYWARD_REPLAY_MAX_BODY); null when it cannot be.
   */
  replay: Buffer[] | null = null;
  replayBytes = 0;
  /** Waiting for room on the route's accounts (capacity/capacity.ts); null when not waiting. */
  ticket: object | null = null;
  /** Since when it waited (performance.now()), then how long (ms); −1 when it did not wait. */
  queuedMs = -1;
  /** The credential (its number) whose room this request holds until it ends; 0 for none. */
  roomOn = 0;
  /** The key's admission under its limits, released when the response closes; null without limits. */
  admission: Admission | null = null;
  // The call's cost, written in one place (`costIs`) and read everywhere:
  // a header's or a body's report (forward.ts, relay.ts), or a scraper
  // run-start's booking (completion.ts).
  #cost = 0;
  #costBad = false;
  #costReported = false;
  /** A scraper run-start request: the upstream path prefix its run is asked about under (`/v2`); null otherwise. */
  runPath: string | null = null;
  /** A synchronous scraper run: booked at its reservation, never settled (ledger/runs.ts). */
  syncRun = false;
  /**
   * A run-start whose client left before its answer came: the exchange's end
   * (the log line, the ledger, the admission) waits until the gateway has
   * read the answer itself (forward.ts `readForRun`), so its run is recorded
   * and settled like any other (docs/limits.md, "Scraper runs").
   */
  afterRun: (() => void) | null = null;
  #run: { readonly id: string } | null = null;
  /** Upstream secrets found (and masked) in this response, for the log line and metrics. */
  masked: readonly SecretForm[] | null = null;

  /** The request target as the client sent it. */
  readonly url: string;

  constructor(id: string, req: GatewayRequest, url: string) {
    this.url = url;
    this.id = id;
    this.start = performance.now();
    this.req = req;
    this.client = req.socket.remoteAddress ?? null;
  }

  /** Record why the request failed, unless a cause is already recorded: a consequence never overwrites it. */
  fail(failure: Failure): void {
    this.failure ??= failure;
  }

  /** The gateway answers (or drops) this request itself; nothing from the upstream is relayed after this. */
  takeOver(failure: Failure): void {
    this.takenOver = true;
    this.failure ??= failure;
  }

  /** The upstream is to blame: a `warn` line and an upstream-error metric. */
  /** Response body bytes sent to the client. */
  get bytesOut(): number {
    return this.#bytesOut;
  }

  /** Body bytes relayed to the client (relay.ts), as they go. */
  relayed(bytes: number): void {
    this.#bytesOut += bytes;
  }

  /** The body of an answer of the gateway's own (its JSON error, the key's status), the only body the client gets. */
  ownBody(bytes: number): void {
    this.#bytesOut = bytes;
  }

  /** The route's credential the request went out with (docs/credentials.md); null until forwarded. */
  get credential(): Credential | null {
    return this.#credential;
  }

  /** Sent with `credential`: first (pipeline.ts), or again on another after a refusal (forward.ts). */
  sendWith(credential: Credential): void {
    this.#credential = credential;
  }

  /** The run its response started, once its body ended (request/cost.ts `RunReader`). */
  get run(): { readonly id: string } | null {
    return this.#run;
  }

  /** What a run-start's body said it started, read as it passed (relay.ts) or by the gateway after its client left (forward.ts). */
  runStarted(run: { readonly id: string } | null): void {
    this.#run = run;
  }

  /** What the upstream reported the call cost, in the route's unit (0: nothing reported). */
  get cost(): number {
    return this.#cost;
  }

  /** The upstream reported a cost that is not a number. */
  get costBad(): boolean {
    return this.#costBad;
  }

  /** `cost` is a figure the upstream reported (or a run's booking), not the 0 of none: only such a cost teaches a budget's estimate. */
  get costReported(): boolean {
    return this.#costReported;
  }

  /** The one writer of the call's cost: `reported` false is the 0 of none. */
  costIs(value: number, bad: boolean, reported: boolean): void {
    this.#cost = value;
    this.#costBad = bad;
    this.#costReported = reported;
  }

  get upstreamFailed(): boolean {
    return this.failure?.by === 'upstream';
  }

  /**
   * `res` of an exchange that is forwarded (http-proxy-3's `web`, as against
   * `ws`): only HTTP requests are, never an upgrade or CONNECT (which Node
   * hands over as a bare socket, `res` null).
   */
  get webRes(): ServerResponse {
    if (this.res === null) throw new Error('an exchange without a response (an upgrade) reached forwarding');
    return this.res;
  }
}

/** The server's request class (`http.createServer({ IncomingMessage })`): a slot for the exchange. */
export class GatewayRequest extends IncomingMessage {
  exchange: Exchange | null = null;
}

/**
 * The exchange of a request the pipeline has taken in. Listeners that read
 * it (the response's close, a chunked body's data, http-proxy-3's events)
 * are attached only after it is set; a request without one is a bug, and
 * says so rather than reading fields of null.
 */
export function exchangeOf(req: IncomingMessage): Exchange {
  const ex = req instanceof GatewayRequest ? req.exchange : null;
  if (ex === null) throw new Error('a request listener ran before the pipeline took the request in');
  return ex;
}
