// Binding a listening socket, with errors a user can act on: the option that
// chose the address is named, so a port already taken says which to change.
import net, { type AddressInfo, type Server } from 'node:net';

/** Listen on `host:port`; a bind failure names `option` (e.g. KEYWARD_PORT) and what to do. */
export function listenOn(server: Server, port: number, host: string, option: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (err: NodeJS.ErrnoException): void => reject(bindError(err, option, host, port));
    server.once('error', onError);
    server.listen(port, host, () => {
      server.off('error', onError);
      resolve();
    });
  });
}

/** A listener that cannot bind: said in one line (docs/operations.md), the option and what to do, no stack. */
export class BindError extends Error {
  override name = 'BindError';
  readonly code = 'KEYWARD_ERR_BIND';
  /** The system's reason (EADDRINUSE, EACCES, …), when it gave one. */
  readonly errno: string | undefined;
  constructor(message: string, errno: string | undefined) {
    super(message);
    this.errno = errno;
  }
}

export function bindError(err: NodeJS.ErrnoException, option: string, host: string, port: number): BindError {
  const where = `${host.includes(':') ? `[${host}]` : host}:${port}`;
  const why =
    err.code === 'EADDRINUSE'
      ? `${where} is already in use (EADDRINUSE: another keyward?); set ${option} to a free port`
      : err.code === 'EACCES'
        ? `${where} needs privileges this process lacks (EACCES); set ${option} to a port above 1023`
        : err.code === 'EADDRNOTAVAIL'
          ? `${host} is not an address of this machine (EADDRNOTAVAIL); check ${option.replace(/PORT$/, 'HOST')}`
          : `cannot listen on ${where} (${err.code ?? err.message})`;
  return new BindError(`${option}: ${why}`, err.code);
}

/**
 * A loopback port nothing listens on now: for a server that must be told its
 * port and binds it itself (PostgreSQL, nginx), or as an address that
 * refuses connections. Another process could take it before it is used;
 * whoever can bind port 0 and keep the socket should do that instead.
 */
export async function freePort(): Promise<number> {
  const s = net.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}
