// A TCP forwarder on 127.0.0.1:0 in front of a server, that can be frozen:
// a silent network partition. Frozen, it keeps every connection open and
// accepts new ones, but moves no byte in either direction and closes
// nothing, so the peers see neither an error nor an answer. Healed, the
// bytes held move on and new connections reach the server.
import net from 'node:net';
import { deadline } from './deadline.ts';

export interface TcpProxy {
  readonly port: number;
  freeze(): void;
  heal(): void;
  close(): Promise<void>;
}

export async function startTcpProxy(targetPort: number, targetHost = '127.0.0.1'): Promise<TcpProxy> {
  let frozen = false;
  const pairs = new Set<{ client: net.Socket; server: net.Socket | null }>();
  const waiting: Array<() => void> = [];
  const link = (pair: { client: net.Socket; server: net.Socket | null }): void => {
    const server = net.connect(targetPort, targetHost);
    pair.server = server;
    pair.client.pipe(server);
    server.pipe(pair.client);
    const end = (): void => {
      pair.client.destroy();
      server.destroy();
      pairs.delete(pair);
    };
    pair.client.on('error', end).on('close', end);
    server.on('error', end).on('close', end);
    if (frozen) {
      pair.client.pause();
      server.pause();
    }
  };
  const proxy = net.createServer((client) => {
    const pair = { client, server: null as net.Socket | null };
    pairs.add(pair);
    if (frozen) {
      // Accepted by the kernel, never answered: like a SYN-ACK from a path that then drops everything.
      client.pause();
      client.on('error', () => client.destroy());
      waiting.push(() => {
        client.resume();
        link(pair);
      });
    } else link(pair);
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  return {
    port: (proxy.address() as net.AddressInfo).port,
    freeze: () => {
      frozen = true;
      for (const p of pairs) {
        // pipe() resumes a paused source on 'drain'; unpiping keeps it still.
        if (p.server !== null) {
          p.client.unpipe(p.server);
          p.server.unpipe(p.client);
          p.server.pause();
        }
        p.client.pause();
      }
    },
    heal: () => {
      frozen = false;
      for (const p of pairs) {
        if (p.server === null) continue;
        p.client.pipe(p.server);
        p.server.pipe(p.client);
      }
      for (const go of waiting.splice(0)) go();
    },
    close: async () => {
      for (const p of pairs) {
        p.client.destroy();
        p.server?.destroy();
      }
      await deadline(new Promise<void>((resolve) => proxy.close(() => resolve())), 5_000, 'proxy closed');
    },
  };
}
