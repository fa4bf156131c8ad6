// What each upstream account can take (docs/credentials.md, "Capacity"):
// a credential's concurrency and rate, as config/capacity.ts reads them from
// `KEYWARD_<ROUTE>_CONCURRENCY` and `KEYWARD_<ROUTE>_RATE`, and the queue's
// settings. Pure.

/** A token bucket: `perSecond` tokens a second, holding at most `burst` (one second's worth, at least 1). */
export interface Rate {
  readonly perSecond: number;
  readonly burst: number;
  /** As written (`600/m`), for the status views. */
  readonly text: string;
}

/** One credential's capacity; null: no limit of that kind. */
export interface CredentialCapacity {
  readonly concurrency: number | null;
  readonly rate: Rate | null;
}

/** A route's capacity, by credential position (label − 1); null on a route with neither option set. */
export type RouteCapacity = readonly CredentialCapacity[];

/** The queue's settings, the same for every route. */
export interface QueueSettings {
  /** The longest a request waits for room, ms (0: never waits). */
  readonly queueWaitMs: number;
  /** The most requests waiting per route. */
  readonly queueMax: number;
}

/** The longest KEYWARD_QUEUE_WAIT may be: a client's own timeout is rarely longer. */
export const QUEUE_WAIT_MAX_MS = 5 * 60_000;
const PER: Readonly<Record<string, number>> = { s: 1, m: 60, h: 3600 };

/** `600/m` → a bucket; null when unreadable. Whole numbers from 1 up, per second, minute or hour. */
export function parseRate(text: string): Rate | null {
  const m = /^\s*([1-9]\d{0,8})\s*\/\s*(s|m|h)\s*$/.exec(text);
  if (m === null) return null;
  const perSecond = Number(m[1]) / (PER[m[2] as string] as number);
  return { perSecond, burst: Math.max(1, Math.floor(perSecond)), text: `${m[1]}/${m[2]}` };
}
