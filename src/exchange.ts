// Per-request state, carried on the request object itself so every event
// handler (pipeline, forwarder, completion log) reads the same fields without
// a lookup. One class with all fields set in the constructor keeps V8's
// object shape stable on the hot path.
import { IncomingMessage, type ClientRequest, type ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Principal } from './keys/keyset.ts';
import type { Route } from './routes.ts';

export class Exchange {
  readonly id: string;
  readonly start: number;
  readonly socket: Socket;
  readonly bytesWritten0: number;
  /** Null for upgrades and CONNECT, which Node hands over as a bare socket. */
  res: ServerResponse | null = null;
  principal: Principal | null = null;
  route: Route | null = null;
  /** The path as logged: credential parameters and anything token-shaped removed. */
  logPath: string | null = null;
  /** Body bytes counted for chunked requests; -1 when the Content-Length says it. */
  bytesIn = -1;
  forwardStart = 0;
  ttfbMs = -1;
  proxyReq: ClientRequest | null = null;
  timer: NodeJS.Timeout | null = null;
  /** The gateway's own error name, or the upstream's error code. */
  failure: string | null = null;
  upstreamFailed = false;
  /** The gateway answered this request itself: later upstream events are ignored. */
  settled = false;
  /** The client connection closed (normally or not). */
  closed = false;

  /** The request target as the client sent it. */
  readonly url: string;

  constructor(id: string, socket: Socket, url: string) {
    this.url = url;
    this.id = id;
    this.start = performance.now();
    this.socket = socket;
    this.bytesWritten0 = socket.bytesWritten;
  }

  stopTimer(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }
}

/** The server's request class (`http.createServer({ IncomingMessage })`): a slot for the exchange. */
export class GatewayRequest extends IncomingMessage {
  exchange: Exchange | null = null;
}
