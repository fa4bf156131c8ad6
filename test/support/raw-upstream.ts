// An upstream that answers with raw bytes, for responses no HTTP server would
// send (bad reason phrases, stray 101s). It counts connections and knows
// which are still open.
import net, { type AddressInfo } from 'node:net';

export interface RawUpstream {
  readonly url: string;
  /** Connections accepted so far. */
  connections(): number;
  /** Connections still open. */
  open(): number;
  /** Request heads received, one per request. */
  readonly heads: string[];
  close(): Promise<void>;
}

/** Close the connection instead of answering (what an upstream's idle timeout does to a request that races it). */
export const CLOSE = Symbol('close');

/**
 * `reply(head, index, onConnection)` returns what to write once a request
 * head has arrived: bytes, null for nothing, or CLOSE. `index` counts every
 * request, `onConnection` those before it on the same connection. A request's
 * body (by its Content-Length) is skipped.
 */
export async function startRawUpstream(
  reply: (head: string, index: number, onConnection: number) => string | Buffer | null | typeof CLOSE,
): Promise<RawUpstream> {
  const sockets = new Set<net.Socket>();
  const heads: string[] = [];
  let count = 0;
  const server = net.createServer((socket) => {
    count++;
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => undefined);
    let buffered = '';
    let served = 0;
    socket.on('data', (d: Buffer) => {
      buffered += d.toString('latin1');
      let end = buffered.indexOf('\r\n\r\n');
      while (end >= 0) {
        const head = buffered.slice(0, end);
        const length = Number(/^content-length: *(\d+)/im.exec(head)?.[1] ?? 0);
        buffered = buffered.slice(end + 4 + length);
        heads.push(head);
        const out = reply(head, heads.length - 1, served++);
        if (out === CLOSE) return void socket.destroy();
        if (out !== null) socket.write(out);
        end = buffered.indexOf('\r\n\r\n');
      }
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    connections: () => count,
    open: () => sockets.size,
    heads,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    },
  };
}
