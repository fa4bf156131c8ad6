// One shared sweep instead of timers per request. Every in-flight exchange
// is visited a few times per timeout period; what it reads are counters the
// sockets keep anyway (bytes read and written), so streaming a body adds no
// per-chunk work at all. Resolution is a tenth of the shortest timeout,
// clamped to 10 ms – 1 s: a 5-minute idle timeout fires within a second of
// its time, a 300 ms test timeout within 30 ms.
import type { Exchange } from './exchange.ts';

export interface TimeoutLimits {
  /** Time for the upstream's response headers once the request is fully sent, ms. */
  readonly upstreamTimeoutMs: number;
  /** No byte in either direction for this long, ms. */
  readonly idleTimeoutMs: number;
}

/**
 * What ran out: `answer` — the upstream did not start its response in time;
 * `request-idle` — the client's body stalled; `upload-stalled` — the
 * upstream stopped taking the body; `response-idle` — the response body
 * stalled (upstream silent, or the client not reading).
 */
export type Expiry = 'answer' | 'request-idle' | 'upload-stalled' | 'response-idle';

function moved(ex: Exchange): number {
  const client = ex.req.socket;
  let n = client.bytesRead + client.bytesWritten;
  const upstream = ex.proxyReq?.socket;
  if (upstream !== null && upstream !== undefined) n += upstream.bytesRead + upstream.bytesWritten;
  return n;
}

/** The expiry due for one exchange at `now`, updating its activity marks; null when none. Pure but for the marks. */
export function due(ex: Exchange, now: number, limits: TimeoutLimits): Expiry | null {
  const activity = moved(ex);
  if (activity !== ex.activity || ex.lastActive === 0) {
    ex.activity = activity;
    ex.lastActive = now;
  }
  const idle = now - ex.lastActive >= limits.idleTimeoutMs;
  if (ex.ttfbMs < 0) {
    const proxyReq = ex.proxyReq;
    // The answer timer starts once the whole request has left for the
    // upstream: a slow upload is the idle timeout's business, not this one's.
    if (proxyReq !== null && proxyReq.writableFinished) {
      if (ex.answerSince === 0) ex.answerSince = now;
      return now - ex.answerSince >= limits.upstreamTimeoutMs ? 'answer' : null;
    }
    if (!idle) return null;
    return ex.req.complete || proxyReq?.writableNeedDrain === true ? 'upload-stalled' : 'request-idle';
  }
  return idle ? 'response-idle' : null;
}

/**
 * The exchanges in flight, visited by one interval timer. Kept in an array
 * with each exchange's slot on the exchange itself, never in a `Set`: a
 * long-lived Set that young objects pass through chains its obsolete hash
 * tables to their successors, and the collector of young objects treats a
 * dead old table's link as live, so every exchange that went through it is
 * promoted to the old generation (bench/README.md, "Where the time went",
 * has what that cost).
 */
export class Sweeper {
  readonly #live: Exchange[] = [];
  readonly #limits: () => TimeoutLimits;
  readonly #expire: (ex: Exchange, what: Expiry) => void;
  #timer: NodeJS.Timeout | null = null;
  #interval = 0;

  /** Told how long each sweep held the event loop, in seconds (metrics). */
  readonly #timed: (seconds: number) => void;

  constructor(limits: () => TimeoutLimits, expire: (ex: Exchange, what: Expiry) => void, timed: (seconds: number) => void = () => undefined) {
    this.#limits = limits;
    this.#expire = expire;
    this.#timed = timed;
  }

  track(ex: Exchange): void {
    if (ex.sweepSlot >= 0) return;
    ex.sweepSlot = this.#live.length;
    this.#live.push(ex);
    if (this.#timer === null) this.#schedule();
  }

  untrack(ex: Exchange): void {
    const slot = ex.sweepSlot;
    if (slot < 0) return;
    ex.sweepSlot = -1;
    const last = this.#live.pop() as Exchange;
    if (last === ex) return;
    this.#live[slot] = last;
    last.sweepSlot = slot;
  }

  /** Exchanges being watched (tests). */
  get size(): number {
    return this.#live.length;
  }

  /** Whether any exchange watched is read on for a client that left (a run-start: `afterRun`). */
  readingForRuns(): boolean {
    return this.#live.some((ex) => ex.afterRun !== null);
  }

  /** Re-derive the sweep interval (after a configuration reload). */
  reschedule(): void {
    if (this.#timer !== null) {
      clearInterval(this.#timer);
      this.#timer = null;
    }
    if (this.#live.length > 0) this.#schedule();
  }

  stop(): void {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
  }

  #schedule(): void {
    const limits = this.#limits();
    this.#interval = Math.min(1_000, Math.max(10, Math.floor(Math.min(limits.upstreamTimeoutMs, limits.idleTimeoutMs) / 10)));
    this.#timer = setInterval(() => {
      const start = performance.now();
      this.sweep(start);
      this.#timed((performance.now() - start) / 1000);
    }, this.#interval);
    this.#timer.unref();
  }

  sweep(now: number): void {
    const limits = this.#limits();
    // Backwards: untrack moves the last exchange into the freed slot, which was visited already.
    for (let i = this.#live.length - 1; i >= 0; i--) {
      const ex = this.#live[i];
      if (ex === undefined) continue;
      if (ex.closed || ex.takenOver) {
        this.untrack(ex);
        continue;
      }
      const what = due(ex, now, limits);
      if (what !== null) {
        this.untrack(ex);
        this.#expire(ex, what);
      }
    }
    if (this.#live.length === 0 && this.#timer !== null) {
      clearInterval(this.#timer);
      this.#timer = null;
    }
  }
}
