// Clients for the tests: a plain HTTP request with a deadline, and a raw
// socket for framing that an HTTP client would refuse to send.
import http from 'node:http';
import net from 'node:net';
import { deadline } from './deadline.ts';

export interface Reply {
  readonly status: number;
  readonly headers: http.IncomingHttpHeaders;
  readonly rawHeaders: readonly string[];
  readonly body: Buffer;
  json(): unknown;
}

export interface RequestOptions {
  method?: string;
  headers?: http.OutgoingHttpHeaders;
  body?: Buffer | string;
  agent?: http.Agent | false;
  timeoutMs?: number;
}

export function request(url: string, options: RequestOptions = {}): Promise<Reply> {
  const done = new Promise<Reply>((resolve, reject) => {
    const req = http.request(url, { method: options.method ?? 'GET', headers: options.headers, agent: options.agent ?? false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const body = Buffer.concat(chunks);
        resolve({
          status: res.statusCode as number,
          headers: res.headers,
          rawHeaders: res.rawHeaders,
          body,
          json: () => JSON.parse(body.toString('utf8')) as unknown,
        });
      });
    });
    req.on('error', reject);
    req.end(options.body);
  });
  return deadline(done, options.timeoutMs ?? 10_000, `${options.method ?? 'GET'} ${url}`);
}

/**
 * Write `bytes` on a fresh connection and collect everything until the
 * server closes it, or until `until(received)` says enough.
 */
export function raw(port: number, bytes: string | Buffer, options: { until?: (received: string) => boolean; timeoutMs?: number } = {}): Promise<string> {
  const done = new Promise<string>((resolve, reject) => {
    const socket = net.connect(port, '127.0.0.1');
    let received = '';
    socket.setEncoding('latin1');
    socket.on('data', (d: string) => {
      received += d;
      if (options.until?.(received)) {
        socket.destroy();
        resolve(received);
      }
    });
    socket.on('error', (err: NodeJS.ErrnoException) => (err.code === 'ECONNRESET' ? resolve(received) : reject(err)));
    socket.on('close', () => resolve(received));
    socket.write(bytes);
  });
  return deadline(done, options.timeoutMs ?? 10_000, 'raw exchange');
}

/** Count complete HTTP responses in a raw byte string (status lines). */
export function statusLines(received: string): string[] {
  return received.match(/HTTP\/1\.1 \d{3}[^\r\n]*/g) ?? [];
}
