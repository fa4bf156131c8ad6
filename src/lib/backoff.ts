// The one backoff: how long to wait before try `attempt` (1, 2, …) of
// something that keeps failing. Doubling from `firstMs`, with ±`jitter`
// (a share of the wait) so that many waiters do not retry in step, and
// never more than `maxMs`, jitter included. Pure but for the jitter.

export interface Backoff {
  readonly firstMs: number;
  readonly maxMs: number;
  /** ±this share of each wait, at random (0: none). */
  readonly jitter?: number;
}

export function backoff(attempt: number, b: Backoff, random: () => number = Math.random): number {
  const base = b.firstMs * 2 ** Math.max(0, attempt - 1);
  const jitter = b.jitter ?? 0;
  return Math.min(b.maxMs, base * (1 - jitter + 2 * jitter * random()));
}
