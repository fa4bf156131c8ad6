// A webhook receiver for alert tests: records every POST it is sent.
import http from 'node:http';
import type { AddressInfo } from 'node:net';

export interface Received {
  readonly body: string;
  readonly signature: string | undefined;
  readonly json: {
    event: string;
    key: { id: string; name: string };
    limit: { kind: string; value: number; threshold: number; unit: string; period: string };
    used: number;
    at: string;
    id: string;
  };
}

/** A webhook receiver on 127.0.0.1 (on `port` when given): records every POST; `hang` leaves requests unanswered. */
export async function startReceiver(port = 0, hang = false): Promise<{ url: string; got: Received[]; close(): Promise<void> }> {
  const got: Received[] = [];
  const server = http.createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString();
      got.push({ body, signature: req.headers['x-keyward-signature'] as string | undefined, json: JSON.parse(body) as Received['json'] });
      if (hang) return;
      res.writeHead(204);
      res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(port, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/hooks/keyward`,
    got,
    close: () =>
      new Promise((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
