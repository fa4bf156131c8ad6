// Room on each upstream account, and the queue of requests waiting for it
// (docs/credentials.md, "Capacity"). One process owns the counts: a single
// gateway itself, or the primary for its workers (capacity/workers.ts). A
// request takes a credential with room (spread: the most room, ties in
// turn; first: the lowest-numbered), or waits in its route's queue, which
// is served round robin over the keys waiting and first in, first out within
// a key, so one key's burst cannot hold another key's single request back by
// more than a slot or so. Every operation is O(credentials): nothing scans
// the queue. Pure but for the clock and timers passed in.
import type { RouteCapacity } from './plan.ts';

/**
 * What a request is told: `label`, the credential it may send on (room
 * taken), or 0 and the seconds to retry after (503 upstream_busy); and how
 * long it waited in the queue, ms (−1: it did not wait).
 */
export type Answer = (label: number, retryAfter: number, waitedMs: number) => void;

/**
 * Room on a route's accounts as the request path asks for it: the owner of
 * the counts itself (Capacity), or a worker asking its primary
 * (capacity/workers.ts). A ticket stands for a request waiting.
 */
export interface Room {
  ask(route: string, key: string, front: boolean, answer: Answer): object | null;
  cancel(route: string, ticket: object): void;
  release(route: string, label: number): void;
}

/** A request waiting for room (or one answered: `line` null). */
export interface Ticket {
  readonly key: string;
  readonly since: number;
  readonly answer: Answer;
  timer: ReturnType<typeof setTimeout> | null;
  prev: Ticket | null;
  next: Ticket | null;
  line: Line | null;
}

/** One key's waiting requests on one route, a ring member. */
interface Line {
  readonly key: string;
  head: Ticket | null;
  tail: Ticket | null;
  /** Requests waiting in it. */
  size: number;
  prev: Line;
  next: Line;
}

interface RouteRoom {
  readonly name: string;
  limits: RouteCapacity;
  inFlight: number[];
  /** In a fleet: what this gateway's leases hold, per credential: slots of its concurrency, units of its rate (of `burst`). */
  heldSlots: number[];
  heldUnits: number[];
  /** In a fleet: requests granted or waiting per credential since the last rebalance (a rate's demand). */
  asked: number[];
  tokens: number[];
  refilled: number[];
  turn: number;
  readonly lines: Map<string, Line>;
  /** The line served next. */
  cursor: Line | null;
  queued: number;
  /** Set while room may come from a refill alone (a rate, no request ending). */
  refill: ReturnType<typeof setTimeout> | null;
  pumping: boolean;
  again: boolean;
}

export interface CapacityHooks {
  /** A request got room after waiting `ms`. */
  waited?(route: string, ms: number): void;
  /** A request was answered busy (queue full, or the wait ran out). */
  busy?(route: string): void;
}

/**
 * What a fleet gateway holds or wants of one credential's capacity
 * (capacity/fleet.ts): `slots` of its concurrency, or `units` of its rate
 * (a rate's burst, each unit a share of its tokens).
 */
export interface Demand {
  readonly route: string;
  readonly label: number;
  readonly kind: 'slots' | 'units';
  /** The whole capacity: the concurrency, or the rate's burst. */
  readonly limit: number;
  /** What requests in flight here use now (slots; units are never in use). */
  readonly inUse: number;
  readonly want: number;
}

export interface CapacitySettings {
  readonly credentialOrder: 'spread' | 'first';
  readonly queueWaitMs: number;
  readonly queueMax: number;
}

/** Where a route's capacity stands (`/readyz`, the metrics). */
export interface RoomView {
  readonly inFlight: readonly number[];
  readonly limit: ReadonlyArray<number | null>;
  readonly queued: number;
}

export class Capacity implements Room {
  readonly #routes = new Map<string, RouteRoom>();
  readonly #available: (route: string, label: number, now: number) => boolean;
  readonly #now: () => number;
  readonly #hooks: CapacityHooks;
  #settings: CapacitySettings;
  /** In a fleet: told when a request found no room here (more may be claimed at once); null: this process holds every credential's whole capacity. */
  #short: (() => void) | null = null;
  /** In a fleet: until when (performance.now()) the leases last renewed are sure to be this gateway's; past it, nothing new is sent. */
  #validUntil = 0;
  readonly #clock: () => number;

  /** `available`: whether a credential is not set aside (request/credentials.ts). */
  constructor(
    settings: CapacitySettings,
    available: (route: string, label: number, now: number) => boolean,
    hooks: CapacityHooks = {},
    now: () => number = Date.now,
    clock: () => number = () => performance.now(),
  ) {
    this.#settings = settings;
    this.#available = available;
    this.#hooks = hooks;
    this.#now = now;
    this.#clock = clock;
  }

  /**
   * In a fleet (capacity/fleet.ts): from now on only what this gateway's
   * leases hold may be used; `short` is told when a request finds no room.
   */
  shareWithFleet(short: () => void): void {
    this.#short = short;
    for (const room of this.#routes.values()) room.tokens.fill(0);
  }

  /** Every credential's capacity this gateway uses or wants, for the fleet's rebalance. Resets the rates' demand window. */
  demands(): Demand[] {
    const out: Demand[] = [];
    for (const room of this.#routes.values()) {
      const n = room.limits.length;
      room.limits.forEach((l, i) => {
        const waiting = Math.ceil(room.queued / n);
        const label = i + 1;
        if (l.concurrency !== null) {
          const inUse = room.inFlight[i] as number;
          out.push({ route: room.name, label, kind: 'slots', limit: l.concurrency, inUse, want: Math.min(l.concurrency, inUse + waiting) });
        }
        // A rate is wanted whole while it is used; each gateway that uses it gets its share.
        if (l.rate !== null)
          out.push({ route: room.name, label, kind: 'units', limit: l.rate.burst, inUse: 0, want: (room.asked[i] ?? 0) + waiting > 0 ? l.rate.burst : 0 });
        room.asked[i] = 0;
      });
    }
    return out;
  }

  /** What this gateway holds now of one credential's capacity (a shrink is applied before the fleet hears of it). */
  holding(route: string, label: number, kind: Demand['kind']): number {
    const room = this.#routes.get(route);
    return (kind === 'slots' ? room?.heldSlots[label - 1] : room?.heldUnits[label - 1]) ?? 0;
  }

  /** The fleet settled what this gateway holds of one credential's capacity. */
  hold(route: string, label: number, kind: Demand['kind'], held: number): void {
    const room = this.#routes.get(route);
    if (room === undefined) return;
    const i = label - 1;
    if (kind === 'slots') room.heldSlots[i] = held;
    else {
      const before = room.heldUnits[i] ?? 0;
      room.heldUnits[i] = held;
      // Fewer units: the tokens saved under more are cut to the new burst, so the fleet's tokens never add up to more than the rate's.
      if (held < before) room.tokens[i] = Math.min(room.tokens[i] ?? 0, held);
    }
  }

  /** The leases were renewed: sure until `until` (performance.now()); room is handed out again. */
  renewedUntil(until: number): void {
    this.#validUntil = until;
    for (const room of this.#routes.values()) this.#pump(room);
  }

  /**
   * The routes' capacities (at start and on reload). What is in flight is
   * kept by route and credential number; a route whose options went away
   * lets its waiting requests go.
   */
  configure(routes: ReadonlyArray<{ readonly name: string; readonly capacity: RouteCapacity | null }>, settings: CapacitySettings): void {
    this.#settings = settings;
    const now = this.#now();
    for (const r of routes) {
      if (r.capacity === null) {
        const old = this.#routes.get(r.name);
        if (old !== undefined) old.limits = old.limits.map(() => ({ concurrency: null, rate: null }));
        continue;
      }
      const room = this.#room(r.name, r.capacity, now);
      room.limits = r.capacity;
      for (let i = 0; i < r.capacity.length; i++) {
        room.inFlight[i] ??= 0;
        room.heldSlots[i] ??= 0;
        room.heldUnits[i] ??= 0;
        room.asked[i] ??= 0;
        const burst = this.#short === null ? (r.capacity[i]?.rate?.burst ?? 0) : 0;
        room.tokens[i] = Math.min(room.tokens[i] ?? burst, burst);
        room.refilled[i] ??= now;
      }
    }
    for (const room of this.#routes.values()) this.#pump(room);
  }

  /**
   * Room on `route` for a request of `key`: answered at once when a
   * credential has room and nobody waits (synchronously), else queued
   * (`front`: a request sent again after its credential refused it goes
   * first among its key's), else busy. The ticket cancels a wait.
   */
  ask(route: string, key: string, front: boolean, answer: Answer): Ticket | null {
    const room = this.#routes.get(route);
    if (room === undefined) {
      answer(0, 1, -1);
      return null;
    }
    const now = this.#now();
    if (room.queued === 0) {
      const i = this.#choose(room, now);
      if (i >= 0) {
        this.#take(room, i);
        answer(i + 1, 0, -1);
        return null;
      }
    }
    this.#short?.();
    if (this.#settings.queueWaitMs === 0 || (room.queued >= this.#settings.queueMax && !this.#makeRoomFor(room, key, now))) {
      this.#hooks.busy?.(route);
      answer(0, this.#retryAfter(room, now), -1);
      return null;
    }
    const t: Ticket = { key, since: now, answer, timer: null, prev: null, next: null, line: null };
    this.#enqueue(room, t, front);
    t.timer = setTimeout(() => this.#expire(room, t), this.#settings.queueWaitMs);
    t.timer.unref();
    this.#pump(room);
    return t;
  }

  /** The client left while waiting: out of the queue at once, holding nothing. */
  cancel(route: string, ticket: object): void {
    const room = this.#routes.get(route);
    const t = ticket as Ticket;
    if (room === undefined || t.line === null) return;
    this.#dequeue(room, t);
    this.#armRefill(room);
  }

  /** A request that took room on credential `label` ended (or went to another). */
  release(route: string, label: number): void {
    const room = this.#routes.get(route);
    if (room === undefined) return;
    const i = label - 1;
    if ((room.inFlight[i] ?? 0) > 0) (room.inFlight[i] as number)--;
    this.#pump(room);
  }

  /** Room may have come back without a request ending (a credential set aside came back). */
  poke(route: string): void {
    const room = this.#routes.get(route);
    if (room !== undefined) this.#pump(room);
  }

  view(route: string): RoomView | null {
    const room = this.#routes.get(route);
    if (room === undefined) return null;
    return { inFlight: [...room.inFlight], limit: room.limits.map((l) => l.concurrency), queued: room.queued };
  }

  /** The routes with a capacity now (one whose options went away on reload is not one). */
  routes(): string[] {
    return [...this.#routes.values()].filter((r) => r.limits.some((l) => l.concurrency !== null || l.rate !== null)).map((r) => r.name);
  }

  #room(name: string, limits: RouteCapacity, now: number): RouteRoom {
    let room = this.#routes.get(name);
    if (room === undefined) {
      room = {
        name,
        limits,
        inFlight: limits.map(() => 0),
        heldSlots: limits.map(() => 0),
        heldUnits: limits.map(() => 0),
        asked: limits.map(() => 0),
        tokens: limits.map((l) => (this.#short === null ? (l.rate?.burst ?? 0) : 0)),
        refilled: limits.map(() => now),
        turn: 0,
        lines: new Map(),
        cursor: null,
        queued: 0,
        refill: null,
        pumping: false,
        again: false,
      };
      this.#routes.set(name, room);
    }
    return room;
  }

  /**
   * Room on credential i now: concurrency left, and whole tokens when it has
   * a rate. In a fleet, of what this gateway's leases hold, and nothing once
   * they may have expired unseen.
   */
  #roomOn(room: RouteRoom, i: number, now: number): number {
    const l = room.limits[i];
    if (l === undefined || !this.#available(room.name, i + 1, now)) return 0;
    const shared = this.#short !== null;
    if (shared && this.#clock() > this.#validUntil) return 0;
    let free = Infinity;
    if (l.concurrency !== null) free = (shared ? Math.min(l.concurrency, room.heldSlots[i] as number) : l.concurrency) - (room.inFlight[i] as number);
    if (l.rate !== null) {
      const share = this.#share(room, i);
      const burst = l.rate.burst * share;
      const tokens = Math.min(burst, (room.tokens[i] as number) + ((now - (room.refilled[i] as number)) * l.rate.perSecond * share) / 1000);
      room.tokens[i] = tokens;
      room.refilled[i] = now;
      free = Math.min(free, Math.floor(tokens + 1e-9));
    }
    return free;
  }

  /** The part of credential i's rate this gateway may use: all of it, or in a fleet the units of its burst its leases hold. */
  #share(room: RouteRoom, i: number): number {
    const burst = room.limits[i]?.rate?.burst;
    return this.#short === null || burst === undefined ? 1 : (room.heldUnits[i] as number) / burst;
  }

  /** The credential a request gets now (its position), or −1 when none has room. */
  #choose(room: RouteRoom, now: number): number {
    const n = room.limits.length;
    const first = this.#settings.credentialOrder === 'first';
    const start = first ? 0 : room.turn % n;
    let best = -1;
    let most = 0;
    for (let k = 0; k < n; k++) {
      const i = (start + k) % n;
      const free = this.#roomOn(room, i, now);
      if (free <= 0) continue;
      if (first) return i;
      if (free > most) [best, most] = [i, free];
    }
    if (best >= 0) room.turn = best + 1;
    return best;
  }

  #take(room: RouteRoom, i: number): void {
    (room.inFlight[i] as number)++;
    room.asked[i] = (room.asked[i] ?? 0) + 1;
    if ((room.limits[i]?.rate ?? null) !== null) room.tokens[i] = (room.tokens[i] as number) - 1;
  }

  /** Hand room to waiting requests while there is some; re-entered calls run once more at the end. */
  #pump(room: RouteRoom): void {
    if (room.pumping) {
      room.again = true;
      return;
    }
    room.pumping = true;
    try {
      do {
        room.again = false;
        while (room.queued > 0) {
          const now = this.#now();
          const i = this.#choose(room, now);
          if (i < 0) break;
          const t = this.#next(room);
          this.#dequeue(room, t);
          this.#take(room, i);
          this.#hooks.waited?.(room.name, now - t.since);
          t.answer(i + 1, 0, now - t.since);
        }
      } while (room.again);
    } finally {
      room.pumping = false;
    }
    this.#armRefill(room);
  }

  /** With requests waiting on a rate alone, a timer for the next token. */
  #armRefill(room: RouteRoom): void {
    if (room.refill !== null || room.queued === 0) return;
    let soonest = Infinity;
    for (let i = 0; i < room.limits.length; i++) {
      const l = room.limits[i] as RouteCapacity[number];
      if (l.rate === null || (l.concurrency !== null && (room.inFlight[i] as number) >= l.concurrency)) continue;
      const perSecond = l.rate.perSecond * this.#share(room, i);
      if (perSecond > 0) soonest = Math.min(soonest, ((1 - (room.tokens[i] as number)) * 1000) / perSecond);
    }
    if (soonest === Infinity) return;
    room.refill = setTimeout(
      () => {
        room.refill = null;
        this.#pump(room);
      },
      Math.max(1, Math.ceil(soonest)),
    );
    room.refill.unref();
  }

  /**
   * The queue is full: one key's burst must not shut the others out. When
   * some key has more waiting than `key` has plus one, that key's newest
   * request gives up its place (503 upstream_busy) for this one. Only when
   * the queue is full does this look at every key waiting (never at every
   * request). False: `key` is itself the one with the most waiting.
   */
  #makeRoomFor(room: RouteRoom, key: string, now: number): boolean {
    let longest: Line | null = null;
    for (const line of room.lines.values()) if (longest === null || line.size > longest.size) longest = line;
    const mine = room.lines.get(key)?.size ?? 0;
    if (longest === null || longest.key === key || longest.size <= mine + 1) return false;
    const evicted = longest.tail as Ticket;
    this.#dequeue(room, evicted);
    this.#hooks.busy?.(room.name);
    evicted.answer(0, this.#retryAfter(room, now), now - evicted.since);
    return true;
  }

  /** Whole seconds until room is likely (a rate's next token; else 1). */
  #retryAfter(room: RouteRoom, now: number): number {
    let soonest = Infinity;
    for (let i = 0; i < room.limits.length; i++) {
      const l = room.limits[i] as RouteCapacity[number];
      if (l.concurrency !== null && (room.inFlight[i] as number) >= l.concurrency) return 1;
      const perSecond = (l.rate?.perSecond ?? 0) * this.#share(room, i);
      if (perSecond > 0) soonest = Math.min(soonest, (1 - this.#roomOn(room, i, now)) / perSecond);
    }
    return Number.isFinite(soonest) ? Math.max(1, Math.ceil(soonest)) : 1;
  }

  #expire(room: RouteRoom, t: Ticket): void {
    t.timer = null;
    if (t.line === null) return;
    this.#dequeue(room, t);
    this.#hooks.busy?.(room.name);
    const now = this.#now();
    t.answer(0, this.#retryAfter(room, now), now - t.since);
  }

  #enqueue(room: RouteRoom, t: Ticket, front: boolean): void {
    let line = room.lines.get(t.key);
    if (line === undefined) {
      line = { key: t.key, head: null, tail: null, size: 0 } as Line;
      room.lines.set(t.key, line);
      // A key new to the ring is served last in this round: just before the cursor.
      if (room.cursor === null) [line.prev, line.next, room.cursor] = [line, line, line];
      else {
        const c = room.cursor;
        [line.prev, line.next] = [c.prev, c];
        c.prev.next = line;
        c.prev = line;
      }
    }
    t.line = line;
    if (front && line.head !== null) {
      [t.next, line.head.prev, line.head] = [line.head, t, t];
    } else {
      t.prev = line.tail;
      if (line.tail === null) line.head = t;
      else line.tail.next = t;
      line.tail = t;
    }
    line.size++;
    room.queued++;
  }

  /** The request served next: the cursor's line's first, the cursor moving on. */
  #next(room: RouteRoom): Ticket {
    const line = room.cursor as Line;
    room.cursor = line.next;
    return line.head as Ticket;
  }

  #dequeue(room: RouteRoom, t: Ticket): void {
    const line = t.line as Line;
    if (t.prev === null) line.head = t.next;
    else t.prev.next = t.next;
    if (t.next === null) line.tail = t.prev;
    else t.next.prev = t.prev;
    t.prev = t.next = t.line = null;
    if (t.timer !== null) clearTimeout(t.timer);
    t.timer = null;
    line.size--;
    room.queued--;
    if (line.head !== null) return;
    // The key's line is empty: out of the ring.
    room.lines.delete(line.key);
    if (line.next === line) room.cursor = null;
    else {
      line.prev.next = line.next;
      line.next.prev = line.prev;
      if (room.cursor === line) room.cursor = line.next;
    }
  }
}

/** A route's capacity as `/readyz` gives it: requests in flight and the limit summed over its credentials (null: one has none), and those waiting. */
export interface CapacityState {
  readonly inFlight: number;
  readonly limit: number | null;
  readonly queued: number;
}

/** Every route with a capacity, as `/readyz` gives it; null when none has one. */
export function capacityStates(c: Pick<Capacity, 'routes' | 'view'>): Record<string, CapacityState> | null {
  const out: Record<string, CapacityState> = {};
  let any = false;
  for (const route of c.routes()) {
    const v = c.view(route);
    if (v === null) continue;
    any = true;
    const limit = v.limit.some((l) => l === null) ? null : v.limit.reduce<number>((a, b) => a + (b ?? 0), 0);
    out[route] = { inFlight: v.inFlight.reduce((a, b) => a + b, 0), limit, queued: v.queued };
  }
  return any ? out : null;
}
