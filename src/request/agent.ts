// The upstream connection pool (docs/security.md, "Upstream connections"):
// one Node agent per upstream, kept alive with an idle lifetime, handing a
// pooled socket straight to the next request.
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
    /** Largest upstream response head, bytes (KEYWARD_UPSTREAM_MAX_HEADER_SIZE). */
    maxHeaderSize = 0;

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

const HttpAgent = singleOrigin(http.Agent);
const HttpsAgent = singleOrigin(https.Agent);

/** The agent for one upstream origin. */
export function upstreamAgent(target: URL, options: { readonly upstreamIdleMs: number; readonly upstreamMaxHeaderBytes: number }): http.Agent {
  const agentOptions: https.AgentOptions = {
    keepAlive: true,
    keepAliveMsecs: 1_000,
    // A pooled connection idle this long is closed by us; Node shortens it
    // to the upstream's `Keep-Alive: timeout=N` hint less a second when
    // that is shorter, and does not pool at all for a hint of 1 s or less.
    timeout: options.upstreamIdleMs,
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
  return agent;
}

/** The idle pooled sockets of `agent`. */
export function freeSockets(agent: http.Agent): Socket[] {
  const free = (agent as unknown as AgentInternals).freeSockets;
  return Object.values(free).flatMap((list) => list ?? []);
}
