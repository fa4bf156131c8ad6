// The gateway's own answers. Every error a client can receive from keyward is
// one row here: a stable `code` (the contract, design §3) plus a fixed message.
// Bodies are serialised once at load time, so replying costs one write.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import { STATUS_CODES } from 'node:http';

export type ErrorCode =
  | 'bad_request'
  | 'unauthorized'
  | 'not_found'
  | 'payload_too_large'
  | 'upstream_unreachable'
  | 'route_not_configured'
  | 'shutting_down'
  | 'upstream_timeout';

interface Entry {
  readonly status: number;
  readonly code: ErrorCode;
  readonly message: string;
}

const entries = {
  malformed: { status: 400, code: 'bad_request', message: 'Malformed request.' },
  tokenInQuery: { status: 400, code: 'bad_request', message: 'The client token must not appear in the URL.' },
  unauthorized: { status: 401, code: 'unauthorized', message: 'Unauthorized.' },
  noRoute: { status: 404, code: 'not_found', message: 'No route for this path.' },
  methodNotAllowed: { status: 404, code: 'not_found', message: 'Method not allowed on this route.' },
  methodOverride: { status: 404, code: 'not_found', message: 'Method overrides are not allowed.' },
  dotSegment: { status: 404, code: 'not_found', message: 'Paths with dot-segments are not allowed.' },
  webSocket: { status: 404, code: 'not_found', message: 'WebSocket upgrades are not proxied.' },
  payloadTooLarge: { status: 413, code: 'payload_too_large', message: 'Request body exceeds the configured limit.' },
  upstreamUnreachable: { status: 502, code: 'upstream_unreachable', message: 'Upstream unreachable.' },
  routeNotConfigured: { status: 503, code: 'route_not_configured', message: 'This route has no upstream credential configured.' },
  shuttingDown: { status: 503, code: 'shutting_down', message: 'The gateway is shutting down.' },
  upstreamTimeout: { status: 504, code: 'upstream_timeout', message: 'Upstream did not answer in time.' },
} as const satisfies Record<string, Entry>;

export type ErrorName = keyof typeof entries;

export interface GatewayError extends Entry {
  readonly name: ErrorName;
  readonly body: Buffer;
}

export const ERRORS: { readonly [K in ErrorName]: GatewayError } = Object.freeze(
  Object.fromEntries(
    Object.entries(entries).map(([name, e]) => [
      name,
      Object.freeze({ ...e, name, body: Buffer.from(JSON.stringify({ error: e.message, code: e.code })) }),
    ]),
  ) as { [K in ErrorName]: GatewayError },
);

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
  const headers: Record<string, string | number> = {
    'content-type': 'application/json',
    'content-length': err.body.length,
    'cache-control': 'no-store',
  };
  if (close) headers.connection = 'close';
  if (err.status === 401) headers['www-authenticate'] = 'Bearer';
  res.writeHead(err.status, headers);
  res.end(err.body);
}

/** The same answer written straight onto a socket that has no ServerResponse (upgrade, CONNECT, parse errors). */
export function writeRawError(socket: Socket, err: GatewayError): void {
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  socket.end(
    `HTTP/1.1 ${err.status} ${STATUS_CODES[err.status] ?? ''}\r\n` +
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
