// What a call costs per route, as this gateway learnt it and as the fleet
// shares it (docs/limits.md, "Reserved at admission"): a moving estimate of
// each route's reported costs, and the dearest call of the current UTC day
// and month, below which no estimate on that route goes. The limiter
// reserves from it; a fleet's leases share it at each renewal (leases.ts).
import type { CostShare } from './leases.ts';
import { periodOf, type Period } from './policy.ts';

/** Weight of the newest cost in an estimate: recent calls count most, one odd call does not swing it. */
const NEWEST = 0.5;

/** An estimate learnt from completed calls, under key `k`. */
export function learn<K>(map: Map<K, number>, k: K, cost: number): void {
  const was = map.get(k);
  map.set(k, was === undefined ? cost : was + NEWEST * (cost - was));
}

/** The dearest call a route reported in the current UTC day and month. */
interface Dearest {
  day: string;
  dayMax: number;
  month: string;
  monthMax: number;
}

export class RouteCosts implements CostShare {
  readonly #perCall = new Map<string, number>();
  readonly #dearest = new Map<string, Dearest>();

  /** A cost was seen on `route` (reported by the upstream, or the fleet's). */
  has(route: string): boolean {
    return this.#perCall.has(route);
  }

  /** The route's estimate per call, if one was learnt. */
  perCall(route: string): number | undefined {
    return this.#perCall.get(route);
  }

  /** The floor an estimate starts from: the dearest call of `period` so far. */
  floor(route: string, period: Period, now: number): number {
    const d = this.#dearest.get(route);
    if (d === undefined) return 0;
    return period === 'day' ? (d.day === periodOf('day', now).key ? d.dayMax : 0) : d.month === periodOf('month', now).key ? d.monthMax : 0;
  }

  /** A call on `route` reported `cost`. */
  learn(route: string, cost: number, now: number): void {
    learn(this.#perCall, route, cost);
    this.#raise(route, cost, now);
  }

  /** What this gateway learnt, for the fleet: the dearest call of the day where it is above the average. */
  learnt(): ReadonlyMap<string, number> {
    const now = Date.now();
    return new Map([...this.#perCall].map(([route, c]) => [route, Math.max(c, this.floor(route, 'day', now))] as const));
  }

  /** The fleet's figure for a route: taken when this gateway has not seen the route, so its first call reserves it instead of nothing. */
  adopt(route: string, perCall: number): void {
    if (!Number.isFinite(perCall) || perCall < 0) return;
    if (!this.#perCall.has(route)) this.#perCall.set(route, perCall);
    this.#raise(route, perCall, Date.now());
  }

  #raise(route: string, cost: number, now: number): void {
    const day = periodOf('day', now).key;
    const month = periodOf('month', now).key;
    let d = this.#dearest.get(route);
    if (d === undefined) this.#dearest.set(route, (d = { day, dayMax: 0, month, monthMax: 0 }));
    if (d.day !== day) [d.day, d.dayMax] = [day, 0];
    if (d.month !== month) [d.month, d.monthMax] = [month, 0];
    d.dayMax = Math.max(d.dayMax, cost);
    d.monthMax = Math.max(d.monthMax, cost);
  }
}
