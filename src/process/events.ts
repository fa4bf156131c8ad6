// The events Node raises on the public server (docs/responses.md), wired to
// the pipeline: requests (and `Expect`), upgrades and CONNECT, parse errors,
// failed TLS handshakes.
import type http from 'node:http';
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { ERRORS, parseFailure } from '../request/errors.ts';
import type { GatewayRequest } from '../request/exchange.ts';
import type { Pipeline } from '../request/pipeline.ts';
import { answer as answerError, writeRawError } from '../request/reply.ts';
import type { Logger } from '../observe/log.ts';

/**
 * The response of the request whose body Node is reading on a connection: a
 * parse error in that body is answered through it (clientError below),
 * without reading Node's private `_httpMessage`. A property of the socket,
 * not a WeakMap entry: a long-lived table that each request's response
 * passes through keeps responses alive past collections of young objects,
 * and so promotes every request's objects to the old generation
 * (bench/README.md, "Where the time went").
 */
const CURRENT = Symbol('keyward.currentResponse');
type Tracked = Duplex & { [CURRENT]?: ServerResponse };

function current(socket: Duplex, res: ServerResponse): void {
  (socket as Tracked)[CURRENT] = res;
}

export function serveEvents(server: http.Server, pipeline: Pipeline, logger: Logger, tls: boolean): void {
  server.on('request', (req: GatewayRequest, res: ServerResponse) => {
    current(req.socket, res);
    pipeline.handle(req, res, 'none');
  });
  // Answer `100 Continue` only once the request passed authentication and
  // routing: a refused upload is refused before the client sends its body.
  server.on('checkContinue', (req: GatewayRequest, res: ServerResponse) => {
    current(req.socket, res);
    pipeline.handle(req, res, 'continue');
  });
  // Any other expectation: without a listener Node answers a bare 417 itself,
  // before authentication, unlogged and uncounted. Through the pipeline it is
  // 401 without a valid token and 417 JSON with one, logged like any refusal.
  server.on('checkExpectation', (req: GatewayRequest, res: ServerResponse) => {
    current(req.socket, res);
    pipeline.handle(req, res, 'other');
  });
  // WebSockets are never proxied (docs/routes.md); nor is any other protocol switch.
  server.on('upgrade', (req: GatewayRequest, socket: Duplex) => pipeline.refuseRaw(req, socket, ERRORS.webSocket));
  server.on('connect', (req: GatewayRequest, socket: Duplex) => pipeline.refuseRaw(req, socket, ERRORS.noRoute));
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Socket) => {
    const answer = parseFailure(err.code);
    // No answer: the client closed its side mid-request, or nobody can read one.
    if (answer === null || !socket.writable) {
      socket.destroy();
      return;
    }
    // The request's head was fine and it is being handled; its body is not
    // (a bad chunk). Answer through its response while nothing of it is sent,
    // else cut the connection: a raw write would corrupt the stream.
    const pending = (socket as Tracked)[CURRENT];
    if (pending !== undefined && !pending.writableFinished) {
      const ex = (pending.req as GatewayRequest).exchange;
      if (pending.headersSent || ex === null || ex.takenOver) {
        socket.destroy();
        return;
      }
      ex.proxyReq?.destroy();
      answerError(ex, pending, answer, true);
      return;
    }
    logger.info({ error: err.code, client: socket.remoteAddress ?? null }, 'malformed request refused');
    writeRawError(socket, answer);
  });
  if (tls) {
    // A failed handshake (plain HTTP to the HTTPS port, a scanner) is not a request.
    server.on('tlsClientError', (_err: Error, socket: Socket) => socket.destroy());
  }
}
