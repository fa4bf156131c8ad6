// A TCP forwarder on 127.0.0.1:0 in front of a server, that can be frozen:
// a silent network partition. Frozen, it keeps every connection open and
// accepts new ones, but moves no byte in either direction and closes
// nothing, so the peers see neither an error nor an answer. Healed, the
// bytes held move on and new connections reach the server. It can also let
// a request through and lose its answer: the connection that sends bytes
// matching a pattern (a COMMIT) gets no reply from then on, while the server
// has acted on it.
import net from 'node:net';
import { deadline } from './deadline.ts';

export interface TcpProxy {
  readonly port: number;
  freeze(): void;
  /**
   * The next connection to send bytes matching `after`, and then (in a later
   * write) bytes matching `pattern`, gets no answer to those, or to anything
   * after (held until `heal`): the request reached the server, its reply is
   * lost.
   */
  loseReplyAfter(pattern: RegExp, after?: RegExp): void;
  heal(): void;
  close(): Promise<void>;
}

interface Pair {
  readonly client: net.Socket;
  server: net.Socket | null;
  /** Bytes held while frozen, per direction. */
  readonly up: Buffer[];
  readonly down: Buffer[];
  /** This connection's answers are held (its request went through). */
  repliesLost: boolean;
  /** It sent what `after` looks for: its next `pattern` loses the reply. */
  armed: boolean;
}

export async function startTcpProxy(targetPort: number, targetHost = '127.0.0.1'): Promise<TcpProxy> {
  let frozen = false;
  let losing: { pattern: RegExp; after: RegExp | null } | null = null;
  const pairs = new Set<Pair>();
  const link = (pair: Pair): void => {
    const server = net.connect(targetPort, targetHost);
    pair.server = server;
    for (const b of pair.up.splice(0)) server.write(b);
    const end = (): void => {
      pair.client.destroy();
      server.destroy();
      pairs.delete(pair);
    };
    server.on('error', end).on('close', end);
    server.on('data', (d: Buffer) => {
      if (frozen || pair.repliesLost) pair.down.push(d);
      else pair.client.write(d);
    });
  };
  const proxy = net.createServer((client) => {
    const pair: Pair = { client, server: null, up: [], down: [], repliesLost: false, armed: false };
    pairs.add(pair);
    client
      .on('error', () => client.destroy())
      .on('close', () => {
        pair.server?.destroy();
        pairs.delete(pair);
      });
    client.on('data', (d: Buffer) => {
      if (frozen || pair.server === null) return void pair.up.push(d);
      pair.server.write(d);
      if (losing === null) return;
      const text = d.toString('latin1');
      if (losing.after !== null && !pair.armed) {
        // Armed by this chunk: the pattern is looked for in the ones after it.
        pair.armed = losing.after.test(text);
        return;
      }
      if (losing.pattern.test(text)) {
        losing = null;
        pair.repliesLost = true;
      }
    });
    // Accepted by the kernel while frozen, never answered: like a SYN-ACK from a path that then drops everything.
    if (!frozen) link(pair);
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  return {
    port: (proxy.address() as net.AddressInfo).port,
    freeze: () => {
      frozen = true;
    },
    loseReplyAfter: (pattern, after) => {
      losing = { pattern, after: after ?? null };
      for (const p of pairs) p.armed = false;
    },
    heal: () => {
      frozen = false;
      losing = null;
      for (const p of pairs) {
        p.repliesLost = false;
        if (p.server === null) link(p);
        else for (const b of p.up.splice(0)) p.server.write(b);
        for (const b of p.down.splice(0)) p.client.write(b);
      }
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
