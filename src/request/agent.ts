// The upstream connection pool (docs/security.md, "Upstream connections"):
// one Node agent per upstream, kept alive with an idle lifetime, handing a
// pooled socket straight to the next request.
//
// It reads parts of Node's agent that are not public API (`addRequest`,
// `getName`, `freeSockets`, `sockets`, `req.onSocket`,
// `socket._httpMessage.res`): test/unit/node-agent-internals.test.ts pins
// each on plain Node objects, so a Node release that changes one fails there
// by name instead of quietly ending connection reuse.
import http from 'node:http';
import https from 'node:https';
import type { Socket } from 'node:net';

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
 * each time, a visible share of a small request's CPU (bench/README.md has
 * the profile). A forwarder's agent serves exactly one origin, so the
 * name is computed once, and when a pooled socket is free it is handed over
 * directly, doing what addRequest does in that case (documented
 * `reuseSocket`, `onSocket`, tracking in `agent.sockets`). New connections,
 * queueing and TLS stay entirely with Node.
 */
function singleOrigin(Base: AgentClass): AgentClass {
  return class SingleOriginAgent extends Base {
    #name: string | null = null;
    /** Largest upstream response head, bytes (KEYWARD_UPSTREAM_MAX_HEADER_SIZE). */
    maxHeaderSize = 0;
    /** A pooled connection's idle lifetime, ms (KEYWARD_UPSTREAM_IDLE). */
    idleMs = 0;
    #sweep: NodeJS.Timeout | null = null;

    /**
     * A socket whose request is done: pooled with its idle deadline, or not
     * pooled at all (false) when the upstream's hint leaves it no time.
     */
    override keepSocketAlive(socket: Socket): boolean {
      const lifetime = idleLifetime(this.idleMs, keepAliveHint(socket));
      if (lifetime <= 0) return false;
      if ((Base.prototype as unknown as { keepSocketAlive(s: Socket): boolean }).keepSocketAlive.call(this, socket) === false) return false;
      (socket as Pooled)[IDLE_UNTIL] = performance.now() + lifetime;
      this.#sweep ??= setInterval(() => this.#closeIdle(), sweepEvery(this.idleMs)).unref();
      return true;
    }

    /** Pooled sockets past their deadline are closed (Node's agent takes a closed one out of its pool). */
    #closeIdle(): void {
      const now = performance.now();
      let pooled = 0;
      for (const socket of freeSockets(this)) {
        if (((socket as Pooled)[IDLE_UNTIL] ?? 0) <= now) socket.destroy();
        else pooled++;
      }
      if (pooled === 0 && this.#sweep !== null) {
        clearInterval(this.#sweep);
        this.#sweep = null;
      }
    }

    override destroy(): void {
      if (this.#sweep !== null) clearInterval(this.#sweep);
      this.#sweep = null;
      super.destroy();
    }

    override getName(options?: http.ClientRequestArgs): string {
      this.#name ??= (Base.prototype as unknown as AgentInternals).getName.call(this, options);
      return this.#name;
    }

    addRequest(req: http.ClientRequest, options: http.ClientRequestArgs): void {
      // Read by Node when it sets up the response parser, after this call.
      // The head is bounded in bytes; a count limit (Node's default: 2000
      // lines) would silently drop headers of a head within that bound.
      (req as unknown as { maxHeaderSize: number }).maxHeaderSize = this.maxHeaderSize;
      req.maxHeadersCount = 0;
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

/** When a pooled socket is to be closed (performance.now() ms): set as it goes back to the pool. */
const IDLE_UNTIL = Symbol('keyward.idleUntil');
type Pooled = Socket & { [IDLE_UNTIL]?: number };

/** The upstream's `Keep-Alive: timeout=N` on the response just read on `socket`, seconds; null without one. */
function keepAliveHint(socket: Socket): number | null {
  // Where Node's own keepSocketAlive reads it: the socket's request, and its response.
  const hint = (socket as unknown as { _httpMessage?: { res?: { headers: Record<string, string | string[] | undefined> } } | null })._httpMessage?.res?.headers[
    'keep-alive'
  ];
  const n = typeof hint === 'string' ? /^timeout=(\d+)/.exec(hint)?.[1] : undefined;
  return n === undefined ? null : Number.parseInt(n, 10);
}

/**
 * How long a pooled connection may stay idle, ms (docs/configuration.md,
 * KEYWARD_UPSTREAM_IDLE): the configured lifetime, or one second less than
 * the upstream's own Keep-Alive timeout when that is sooner; 0 (not pooled)
 * when that leaves no time. The same rule Node's agent applies with its
 * `timeout` option, which the agent is not given: with it, Node arms a
 * timer on the socket and adds and removes a listener for every request,
 * for a deadline that only matters once the socket is idle.
 */
export function idleLifetime(idleMs: number, hintSeconds: number | null): number {
  if (hintSeconds === null) return idleMs;
  const hinted = hintSeconds * 1000 - 1000;
  return hinted <= 0 ? 0 : Math.min(idleMs, hinted);
}

/** How often the pool is swept for idle sockets: a quarter of the lifetime, at most 250 ms (a second's margin before the upstream's own timeout, kept). */
const sweepEvery = (idleMs: number): number => Math.max(25, Math.min(250, Math.floor(idleMs / 4)));

const HttpAgent = singleOrigin(http.Agent);
const HttpsAgent = singleOrigin(https.Agent);

/** The agent for one upstream origin. */
export function upstreamAgent(target: URL, options: { readonly upstreamIdleMs: number; readonly upstreamMaxHeaderBytes: number }): http.Agent {
  const agentOptions: https.AgentOptions = {
    keepAlive: true,
    keepAliveMsecs: 1_000,
    // No `timeout`: a pooled connection's idle lifetime is the agent's own
    // sweep (idleLifetime above), not a timer on every socket.
    maxSockets: Infinity,
    maxFreeSockets: 256,
    // Reuse the most recently used socket: it is the least likely to have
    // been closed by the upstream's own keep-alive timer.
    scheduling: 'lifo',
    // TLS sessions are cached per agent (Node's default, 100 sessions), so
    // new upstream connections resume instead of a full handshake.
    maxCachedSessions: 100,
  };
  const agent = target.protocol === 'https:' ? new HttpsAgent(agentOptions) : new HttpAgent(agentOptions);
  (agent as unknown as { maxHeaderSize: number }).maxHeaderSize = options.upstreamMaxHeaderBytes;
  (agent as unknown as { idleMs: number }).idleMs = options.upstreamIdleMs;
  return agent;
}

/** The idle pooled sockets of `agent`. */
export function freeSockets(agent: http.Agent): Socket[] {
  const free = (agent as unknown as AgentInternals).freeSockets;
  return Object.values(free).flatMap((list) => list ?? []);
}
