// A recording stand-in for an upstream. Clients connect to a raw TCP tap that
// keeps every byte it receives and relays it to an http server behind it, so
// tests can assert on exactly what reached "the upstream" (Node's http server
// reads its sockets natively, so a `data` listener on them sees nothing).
import http, { type IncomingMessage, type ServerResponse } from 'node:http';
import net, { type AddressInfo } from 'node:net';

export interface Recorded {
  readonly method: string;
  readonly url: string;
  readonly headers: http.IncomingHttpHeaders;
  readonly rawHeaders: readonly string[];
  body: Buffer;
  /** Set when the request's body ended or the request was torn down. */
  ended: boolean;
  aborted: boolean;
}

/** An upstream's answer; one that fails (rejects) ends its response, so the test sees a cut, not a hang. */
export type Handler = (req: IncomingMessage, res: ServerResponse, rec: Recorded) => unknown;

export interface MockUpstream {
  readonly url: string;
  readonly requests: Recorded[];
  /** Every byte any client sent to this upstream, in arrival order per connection. */
  raw(): Buffer;
  connections(): number;
  handler: Handler;
  close(): Promise<void>;
}

/** Reads the whole body, then answers 200 with a small JSON echo of method and url. */
export const echo: Handler = (req, res, rec) => {
  req.on('end', () => {
    const body = JSON.stringify({ ok: true, method: rec.method, url: rec.url, bytes: rec.body.length });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
};

export async function startUpstream(handler: Handler = echo, options: { recordBodies?: boolean } = {}): Promise<MockUpstream> {
  const recordBodies = options.recordBodies ?? true;
  const chunks: Buffer[] = [];
  const sockets = new Set<net.Socket>();
  let connectionCount = 0;
  const requests: Recorded[] = [];

  const inner = http.createServer({ requireHostHeader: false });
  const mock: MockUpstream = {
    url: '',
    requests,
    raw: () => Buffer.concat(chunks),
    connections: () => connectionCount,
    handler,
    close: async () => {
      for (const s of sockets) s.destroy();
      inner.closeAllConnections();
      await Promise.all([new Promise((r) => tap.close(r)), new Promise((r) => inner.close(r))]);
    },
  };
  inner.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const rec: Recorded = {
      method: req.method as string,
      url: req.url as string,
      headers: req.headers,
      rawHeaders: req.rawHeaders,
      body: Buffer.alloc(0),
      ended: false,
      aborted: false,
    };
    requests.push(rec);
    if (recordBodies) req.on('data', (c: Buffer) => (rec.body = Buffer.concat([rec.body, c])));
    req.on('end', () => (rec.ended = true));
    req.on('close', () => {
      if (!req.complete || !res.writableFinished) rec.aborted = true;
    });
    const answered = mock.handler(req, res, rec);
    if (answered instanceof Promise) answered.catch((err: Error) => res.destroy(err));
  });
  inner.on('connection', (s: net.Socket) => sockets.add(s));
  await new Promise<void>((r) => inner.listen(0, '127.0.0.1', r));
  const innerPort = (inner.address() as AddressInfo).port;

  const tap = net.createServer((client) => {
    connectionCount++;
    sockets.add(client);
    const server = net.connect(innerPort, '127.0.0.1');
    sockets.add(server);
    client.on('data', (d: Buffer) => chunks.push(d));
    client.pipe(server).pipe(client);
    const teardown = (): void => {
      client.destroy();
      server.destroy();
    };
    client.on('error', teardown).on('close', teardown);
    server.on('error', teardown).on('close', teardown);
  });
  await new Promise<void>((r) => tap.listen(0, '127.0.0.1', r));
  (mock as { url: string }).url = `http://127.0.0.1:${(tap.address() as AddressInfo).port}`;
  return mock;
}
