// The gateway's own answers. Every error a client can receive from keyward is
// one row here: a stable `code` (the contract, design §3) plus a fixed message.
// Bodies are serialised once at load time, so replying costs one write.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { STATUS_CODES } from 'node:http';
import type { Exchange } from './exchange.ts';

export type ErrorCode =
  | 'bad_request'
  | 'unauthorized'
  | 'forbidden'
  | 'not_found'
  | 'request_timeout'
  | 'payload_too_large'
  | 'expectation_failed'
  | 'headers_too_large'
  | 'upstream_unreachable'
  | 'route_not_configured'
  | 'shutting_down'
  | 'keystore_unavailable'
  | 'upstream_timeout';

interface Entry {
  readonly status: number;
  readonly code: ErrorCode;
  readonly message: string;
}

const entries = {
  malformed: { status: 400, code: 'bad_request', message: 'Malformed request.' },
  tokenInUrl: { status: 400, code: 'bad_request', message: 'A client token must not appear in the URL.' },
  badPathEscape: { status: 400, code: 'bad_request', message: 'The path holds an encoded control character, a %u escape or overlong UTF-8.' },
  unauthorized: { status: 401, code: 'unauthorized', message: 'Unauthorized.' },
  forbidden: { status: 403, code: 'forbidden', message: 'This key may not use this route.' },
  noRoute: { status: 404, code: 'not_found', message: 'No route for this path.' },
  methodNotAllowed: { status: 404, code: 'not_found', message: 'Method not allowed on this route.' },
  methodOverride: { status: 404, code: 'not_found', message: 'Method overrides are not allowed.' },
  dotSegment: { status: 404, code: 'not_found', message: 'Paths with dot-segments are not allowed.' },
  webSocket: { status: 404, code: 'not_found', message: 'WebSocket upgrades are not proxied.' },
  requestTimeout: { status: 408, code: 'request_timeout', message: 'The request body stalled.' },
  payloadTooLarge: { status: 413, code: 'payload_too_large', message: 'Request body exceeds the configured limit.' },
  // RFC 9110 §10.1.1: 100-continue is the only expectation defined; anything else may be refused with 417.
  expectationFailed: { status: 417, code: 'expectation_failed', message: 'Only Expect: 100-continue is supported.' },
  headersTooLarge: { status: 431, code: 'headers_too_large', message: 'Request headers exceed the configured limit.' },
  upstreamUnreachable: { status: 502, code: 'upstream_unreachable', message: 'Upstream unreachable.' },
  upstreamUnscannable: { status: 502, code: 'upstream_unreachable', message: 'The upstream answered in a content coding the gateway cannot inspect.' },
  routeNotConfigured: { status: 503, code: 'route_not_configured', message: 'This route has no upstream credential configured.' },
  shuttingDown: { status: 503, code: 'shutting_down', message: 'The gateway is shutting down.' },
  keystoreUnavailable: { status: 503, code: 'keystore_unavailable', message: 'No key set is available.' },
  upstreamTimeout: { status: 504, code: 'upstream_timeout', message: 'Upstream did not answer in time.' },
} as const satisfies Record<string, Entry>;

export type ErrorName = keyof typeof entries;

export interface GatewayError extends Entry {
  readonly name: ErrorName;
  /** The status line's reason phrase. */
  readonly reason: string;
  readonly body: Buffer;
}

export const ERRORS: { readonly [K in ErrorName]: GatewayError } = Object.freeze(
  Object.fromEntries(
    Object.entries(entries).map(([name, e]) => [
      name,
      Object.freeze({ ...e, name, reason: STATUS_CODES[e.status] ?? '', body: Buffer.from(JSON.stringify({ error: e.message, code: e.code })) }),
    ]),
  ) as { [K in ErrorName]: GatewayError },
);

// Connections the gateway has decided to close. Node keeps parsing what a
// client pipelined behind a refused request (its unread body included) and
// hands each one over as a request; none of them may be forwarded (and
// billed) when the client will only ever see the refusal.
const closing = new WeakSet<Socket>();

/** True once a response on this connection said `Connection: close`. */
export function isClosing(socket: Socket): boolean {
  return closing.has(socket);
}

/**
 * Answer with a catalogue error. `close` asks the client to open a new
 * connection: used when an unread request body is still on the wire, so it is
 * never parsed as the next request.
 */
export function sendError(res: ServerResponse, err: GatewayError, close: boolean): void {
  if (res.headersSent || res.destroyed) {
    res.destroy();
    return;
  }
  if (close && res.socket !== null) closing.add(res.socket);
  const headers: Record<string, string | number> = {
    'content-type': 'application/json',
    'content-length': err.body.length,
    'cache-control': 'no-store',
  };
  if (close) headers.connection = 'close';
  if (err.status === 401) headers['www-authenticate'] = 'Bearer';
  // The reason phrase is always ours: a writeHead that threw on an upstream's
  // invalid reason phrase has already stored it on `res`, and Node would
  // reuse it here and throw again, outside any handler.
  res.writeHead(err.status, err.reason, headers);
  res.end(err.body);
}

/** The gateway answers this exchange itself: recorded for the completion line, then sent. */
export function answer(ex: Exchange, res: ServerResponse, err: GatewayError, close: boolean): void {
  ex.settled = true;
  ex.failure ??= err.code;
  ex.bytesOut = res.headersSent ? ex.bytesOut : err.body.length;
  sendError(res, err, close);
}

/** The same answer written straight onto a socket that has no ServerResponse (upgrade, CONNECT, parse errors). */
export function writeRawError(socket: Socket, err: GatewayError): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  socket.end(
    `HTTP/1.1 ${err.status} ${err.reason}\r\n` +
      'content-type: application/json\r\n' +
      `content-length: ${err.body.length}\r\n` +
      'cache-control: no-store\r\n' +
      'connection: close\r\n\r\n' +
      err.body.toString('latin1'),
    'latin1',
  );
}

/**
 * Upstream failures, translated in one place (style habit 2). The gateway owns
 * its timers and marks the error it raises, so a timeout is never confused
 * with a reset: `ECONNECT_TIMEOUT` comes from http-proxy-3's connect timer,
 * `KEYWARD_UPSTREAM_TIMEOUT` from ours. Everything else before the response
 * began (refused, reset, DNS, TLS) is "unreachable".
 */
export function upstreamFailure(code: string | undefined): GatewayError {
  switch (code) {
    case 'ECONNECT_TIMEOUT':
    case 'ETIMEDOUT':
    case 'KEYWARD_UPSTREAM_TIMEOUT':
      return ERRORS.upstreamTimeout;
    default:
      return ERRORS.upstreamUnreachable;
  }
}
