// Writing the gateway's own answers (the catalogue is errors.ts), and
// remembering the connections an answer has closed.
import type { ServerResponse } from 'node:http';
import type { Socket } from 'node:net';
import type { GatewayError } from './errors.ts';
import type { Exchange } from './exchange.ts';

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
function sendError(res: ServerResponse, err: GatewayError, close: boolean, extra: Readonly<Record<string, string | number>> | null = null): void {
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
  if (extra !== null) Object.assign(headers, extra);
  // The reason phrase is always ours: a writeHead that threw on an upstream's
  // invalid reason phrase has already stored it on `res`, and Node would
  // reuse it here and throw again, outside any handler.
  res.writeHead(err.status, err.reason, headers);
  res.end(err.body);
}

/** The gateway answers this exchange itself: recorded for the completion line, then sent. */
export function answer(
  ex: Exchange,
  res: ServerResponse,
  err: GatewayError,
  close: boolean,
  extra: Readonly<Record<string, string | number>> | null = null,
): void {
  ex.takeOver({ by: 'gateway', code: err.code });
  if (!res.headersSent) ex.ownBody(err.body.length);
  sendError(res, err, close, extra);
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
