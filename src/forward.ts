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
// - `proxyTimeout` surfaces as a reset; the gateway runs its own timer and
//   marks the error, so 504 and 502 stay apart.
import http from 'node:http';
import https from 'node:https';
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { ProxyServer } from 'http-proxy-3';
import { ERRORS, sendError, upstreamFailure } from './errors.ts';
import type { Exchange, GatewayRequest } from './exchange.ts';
import { downstreamResponseHeaders } from './headers.ts';
import type { Route } from './routes.ts';

export interface ForwardOptions {
  readonly upstreamTimeoutMs: number;
  readonly connectTimeoutMs: number;
}

type ErrorWithCode = Error & { code?: string };

function timeoutError(): ErrorWithCode {
  const err: ErrorWithCode = new Error('upstream did not answer in time');
  err.code = 'KEYWARD_UPSTREAM_TIMEOUT';
  return err;
}

function onUpstreamTimeout(ex: Exchange, res: ServerResponse): void {
  ex.timer = null;
  if (ex.settled || ex.closed) return;
  if (ex.proxyReq !== null) {
    ex.proxyReq.destroy(timeoutError()); // reaches onError below as a 504
    return;
  }
  // No socket was ever assigned: answer now; onProxyReq destroys it if one comes.
  ex.settled = true;
  ex.upstreamFailed = true;
  ex.failure = 'KEYWARD_UPSTREAM_TIMEOUT';
  sendError(res, ERRORS.upstreamTimeout, true);
}

function onProxyReq(proxyReq: http.ClientRequest, req: http.IncomingMessage): void {
  const ex = (req as GatewayRequest).exchange as Exchange;
  ex.proxyReq = proxyReq;
  if (ex.settled || ex.closed) proxyReq.destroy();
}

function onProxyRes(proxyRes: http.IncomingMessage, req: http.IncomingMessage, res: ServerResponse): void {
  const ex = (req as GatewayRequest).exchange as Exchange;
  ex.stopTimer();
  ex.ttfbMs = performance.now() - ex.forwardStart;
  if (ex.settled || ex.closed || res.headersSent) {
    proxyRes.destroy();
    return;
  }
  // An upstream that dies mid-body: the status is already out, so the only
  // honest signal left is to close the client's connection at once.
  proxyRes.on('error', () => undefined);
  proxyRes.once('close', () => {
    if (!proxyRes.complete && !ex.closed) {
      ex.upstreamFailed = true;
      ex.failure = 'upstream_aborted';
      res.destroy();
    }
  });
  try {
    res.writeHead(proxyRes.statusCode as number, proxyRes.statusMessage, downstreamResponseHeaders(proxyRes.rawHeaders));
  } catch {
    // A header Node refuses to write (invalid characters from the upstream).
    ex.upstreamFailed = true;
    ex.failure = 'invalid_upstream_response';
    proxyRes.destroy();
    sendError(res, ERRORS.upstreamUnreachable, true);
    return;
  }
  proxyRes.pipe(res);
}

function onError(err: ErrorWithCode, req: http.IncomingMessage, res: ServerResponse | Socket): void {
  const ex = (req as GatewayRequest).exchange as Exchange;
  ex.stopTimer();
  // A fully read request is auto-destroyed, so `req.destroyed` says nothing
  // about the client; its socket does.
  if (ex.settled || ex.closed || req.socket.destroyed) {
    ex.proxyReq?.destroy();
    return;
  }
  const response = res as ServerResponse;
  ex.upstreamFailed = true;
  ex.failure = err.code ?? 'error';
  if (response.headersSent) {
    response.destroy();
    return;
  }
  ex.settled = true;
  sendError(response, upstreamFailure(err.code), !req.complete);
}

type AgentClass = new (options?: http.AgentOptions) => http.Agent;
interface AgentInternals {
  getName(options?: http.ClientRequestArgs): string;
  addRequest(req: http.ClientRequest, options: http.ClientRequestArgs): void;
  freeSockets: Record<string, Socket[] | undefined>;
  sockets: Record<string, Socket[] | undefined>;
}

/**
 * Node's Agent#addRequest copies every request's options into a
 * dictionary-mode object and re-derives the pool name and TLS server name
 * each time: 8 % of the gateway's CPU in the small-request profile
 * (bench/README.md). A forwarder's agent serves exactly one origin, so the
 * name is computed once, and when a pooled socket is free it is handed over
 * directly, doing what addRequest does in that case (documented
 * `reuseSocket`, `onSocket`, tracking in `agent.sockets`). New connections,
 * queueing and TLS stay entirely with Node.
 */
function singleOrigin(Base: AgentClass): AgentClass {
  return class SingleOriginAgent extends Base {
    #name: string | null = null;

    override getName(options?: http.ClientRequestArgs): string {
      this.#name ??= (Base.prototype as unknown as AgentInternals).getName.call(this, options);
      return this.#name;
    }

    addRequest(req: http.ClientRequest, options: http.ClientRequestArgs): void {
      const self = this as unknown as AgentInternals;
      const name = this.#name;
      const free = name === null ? undefined : self.freeSockets[name];
      if (name !== null && free !== undefined) {
        let socket = free.pop();
        while (socket !== undefined && socket.destroyed) socket = free.pop();
        if (free.length === 0) delete self.freeSockets[name];
        if (socket !== undefined) {
          this.reuseSocket(socket, req);
          (req as unknown as { onSocket(s: Socket): void }).onSocket(socket);
          (self.sockets[name] ??= []).push(socket);
          return;
        }
      }
      (Base.prototype as unknown as AgentInternals).addRequest.call(this, req, options);
    }
  };
}

const HttpAgent = singleOrigin(http.Agent);
const HttpsAgent = singleOrigin(https.Agent);

export class Forwarder {
  readonly #proxy: ProxyServer;
  readonly #agent: http.Agent;
  readonly #timeoutMs: number;

  constructor(route: Route, options: ForwardOptions) {
    const agentOptions: http.AgentOptions = {
      keepAlive: true,
      keepAliveMsecs: 1_000,
      maxSockets: Infinity,
      maxFreeSockets: 256,
      // Reuse the most recently used socket: it is the least likely to have
      // been closed by the upstream's own keep-alive timer.
      scheduling: 'lifo',
    };
    this.#agent = route.target.protocol === 'https:' ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
    this.#timeoutMs = options.upstreamTimeoutMs;
    this.#proxy = new ProxyServer({
      target: route.target,
      agent: this.#agent,
      // Host header and TLS SNI are the upstream's own.
      changeOrigin: true,
      // Take req.url as it is (see the header comment).
      toProxy: true,
      selfHandleResponse: true,
      xfwd: false,
      secure: true,
      connectTimeout: options.connectTimeoutMs,
    });
    // Not part of the typed API, but the documented way the library composes
    // its passes: drop the one that breaks request framing.
    const internals = this.#proxy as unknown as { webPasses: Array<{ name: string }> };
    internals.webPasses = internals.webPasses.filter((pass) => pass.name !== 'deleteLength');
    this.#proxy.on('proxyReq', onProxyReq);
    this.#proxy.on('proxyRes', onProxyRes);
    // Every call passes its own callback, so this never fires; it is here so
    // that a library change can never turn an upstream failure into a crash.
    this.#proxy.on('error', (err, req, res) => onError(err, req, res));
  }

  /** Send the (already rewritten) request upstream and stream the answer back. */
  forward(req: GatewayRequest, res: ServerResponse, ex: Exchange): void {
    ex.forwardStart = performance.now();
    ex.timer = setTimeout(onUpstreamTimeout, this.#timeoutMs, ex, res);
    this.#proxy.web(req, res, onError);
  }

  close(): void {
    this.#agent.destroy();
  }
}
