// An upstream that counts requests in flight per credential, as a provider
// account does (docs/credentials.md, "Capacity"): from a request's arrival
// to the end of its answer (or its connection's close). Past `allow` on one
// credential it answers 429 too_many_concurrent_requests, as the voice
// provider does; the test reads the most it ever saw at once.
import type http from 'node:http';
import { startUpstream, type MockUpstream } from './upstream.ts';

export interface CountingUpstream {
  readonly up: MockUpstream;
  readonly url: string;
  /** The most requests in flight at once, by credential (its number). */
  readonly most: Map<number, number>;
  /** In flight now, by credential. */
  readonly now: Map<number, number>;
  /** Arrivals in order: the credential and the client's `x-who` header. */
  readonly arrivals: Array<{ label: number; who: string; at: number }>;
  /** Answers of 429 given for being past `allow`. */
  refusedForConcurrency(): number;
  close(): Promise<void>;
}

export interface CountingOptions {
  /** Each credential's header value, in credential order (credential n is `secrets[n-1]`). */
  readonly secrets: readonly string[];
  /** The header the credential travels in. */
  readonly header: string;
  /** The provider's own limit per credential; past it: 429. */
  readonly allow: number;
  /** How long each answer takes, ms (or `never`: no answer at all); `holdFor` decides per request, by its `x-who`. */
  readonly holdMs: number | 'never';
  readonly holdFor?: (who: string) => number | 'never';
}

export async function countingUpstream(o: CountingOptions): Promise<CountingUpstream> {
  const most = new Map<number, number>();
  const now = new Map<number, number>();
  const arrivals: CountingUpstream['arrivals'] = [];
  let refused = 0;
  const up = await startUpstream((req: http.IncomingMessage, res: http.ServerResponse) => {
    const label = o.secrets.indexOf(String(req.headers[o.header])) + 1;
    const inFlight = (now.get(label) ?? 0) + 1;
    now.set(label, inFlight);
    most.set(label, Math.max(most.get(label) ?? 0, inFlight));
    arrivals.push({ label, who: String(req.headers['x-who'] ?? ''), at: Date.now() });
    let over = false;
    const end = (): void => {
      if (over) return;
      over = true;
      now.set(label, (now.get(label) ?? 1) - 1);
    };
    res.on('finish', end);
    res.on('close', end);
    req.resume();
    req.on('end', () => {
      if (inFlight > o.allow) {
        refused++;
        const body = JSON.stringify({ detail: { status: 'too_many_concurrent_requests' } });
        res.writeHead(429, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
        return res.end(body);
      }
      const hold = o.holdFor?.(String(req.headers['x-who'] ?? '')) ?? o.holdMs;
      if (hold === 'never') return;
      setTimeout(() => {
        const body = JSON.stringify({ credential: label });
        res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
        res.end(body);
      }, hold);
    });
  });
  return { up, url: up.url, most, now, arrivals, refusedForConcurrency: () => refused, close: () => up.close() };
}
