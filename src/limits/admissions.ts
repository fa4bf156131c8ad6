// Where a key's limits are decided (docs/limits.md, "One key, one limit"):
// one place per machine. A single gateway process decides in-process. With
// KEYWARD_WORKERS > 1 the primary decides for every worker: a worker asks
// over the cluster's IPC channel for each request of a key that has limits
// and tells the primary when it is over, so rate, burst, concurrency, quota
// and budget hold for the machine as they do for one process. A key without
// limits never asks: its requests cost what they cost with one process.
import type { Worker } from 'node:cluster';
import type { Principal } from '../keys/keyset.ts';
import type { Admission, LimitState, Limiter, Refused } from './limiter.ts';
import type { Limits } from '../keys/limits.ts';
import { policyOf, type Policy } from './policy.ts';
import { detach, neverRejects } from '../lib/detach.ts';

/** Admission for one request of a key with limits: at once, or after the primary answered. */
export type Admit = (principal: Principal, policy: Policy, route: string, now: number) => Admission | Refused | Promise<Admission | Refused>;

const ADMIT = 'keyward:admit';
const ADMITTED = 'keyward:admitted';
const DONE = 'keyward:done';
const STATUS = 'keyward:status';
const STATUS_RES = 'keyward:status-res';

interface AdmitMessage {
  readonly type: typeof ADMIT;
  readonly id: number;
  readonly key: string;
  /** The key's name, for the alerts the primary fires. */
  readonly name: string;
  readonly limits: string;
  readonly route: string;
  readonly now: number;
}
interface StatusMessage {
  readonly type: typeof STATUS;
  readonly id: number;
  readonly key: string;
  readonly limits: string;
}
interface StatusAnswer {
  readonly type: typeof STATUS_RES;
  readonly id: number;
  readonly limits: readonly LimitState[];
}
interface AdmittedMessage {
  readonly type: typeof ADMITTED;
  readonly id: number;
  readonly refused: Refused | null;
  /** An admission's budget figures (limiter.ts `reserved`, `left`), when its route has a budget. */
  readonly reserved?: number;
  readonly left?: number;
}
interface DoneMessage {
  readonly type: typeof DONE;
  readonly id: number;
  readonly reached: boolean;
  readonly cost: number;
}

/** How long a worker waits for the primary's answer before refusing (the primary is stuck or gone). */
const ANSWER_MS = 5_000;
const NO_ANSWER: Refused = { code: 'concurrency_limited', detail: null, retryAfter: 1, limit: null, remaining: null, reset: 1, policy: null };

/** The limits as sent to the primary: serialised once per key record. */
const SENT = new WeakMap<object, string>();
const sent = (p: Principal): string => {
  let s = SENT.get(p);
  if (s === undefined) {
    s = JSON.stringify(p.limits ?? null);
    SENT.set(p, s);
  }
  return s;
};

/**
 * In a worker: ask the primary. `send` is the worker's IPC channel
 * (process.send); `on` subscribes to the primary's messages.
 */
export function remoteAdmit(send: (m: AdmitMessage | DoneMessage | StatusMessage) => void, on: (listener: (m: unknown) => void) => void): Admit {
  let next = 0;
  const waiting = new Map<number, (r: Refused | null, budget: { reserved: number; left: number } | null) => void>();
  on((m) => {
    const msg = m as Partial<AdmittedMessage> | null;
    if (msg?.type !== ADMITTED || typeof msg.id !== 'number') return;
    const settle = waiting.get(msg.id);
    if (settle === undefined) return;
    waiting.delete(msg.id);
    const budget =
      typeof msg.reserved === 'number' && typeof msg.left === 'number' && Number.isFinite(msg.reserved) && Number.isFinite(msg.left)
        ? { reserved: msg.reserved, left: msg.left }
        : null;
    settle(msg.refused ?? null, budget);
  });
  return (principal, _policy, route, now) => {
    const id = ++next;
    return new Promise<Admission | Refused>((resolve) => {
      const timer = setTimeout(() => {
        waiting.delete(id);
        resolve(NO_ANSWER);
      }, ANSWER_MS);
      timer.unref();
      waiting.set(id, (refused, budget) => {
        clearTimeout(timer);
        if (refused !== null) return resolve(refused);
        let over = false;
        const done = (reached: boolean, cost: number): void => {
          if (over) return;
          over = true;
          send({ type: DONE, id, reached, cost });
        };
        resolve(budget === null ? { done } : { done, left: budget.left, reserved: budget.reserved });
      });
      send({ type: ADMIT, id, key: principal.id, name: principal.name, limits: sent(principal), route, now });
    });
  };
}

/**
 * In a worker: where a key's limits stand, asked of the primary that
 * decides them (GET /keyward/key); null when it does not answer in time.
 */
export function remoteStatus(
  send: (m: StatusMessage) => void,
  on: (listener: (m: unknown) => void) => void,
): (principal: Principal) => Promise<readonly LimitState[] | null> {
  let next = 0;
  const waiting = new Map<number, (r: readonly LimitState[] | null) => void>();
  on((m) => {
    const msg = m as Partial<StatusAnswer> | null;
    if (msg?.type !== STATUS_RES || typeof msg.id !== 'number') return;
    waiting.get(msg.id)?.(Array.isArray(msg.limits) ? msg.limits : null);
    waiting.delete(msg.id);
  });
  return (principal) =>
    new Promise((resolve) => {
      const id = ++next;
      const timer = setTimeout(() => {
        waiting.delete(id);
        resolve(null);
      }, ANSWER_MS);
      timer.unref();
      waiting.set(id, (r) => {
        clearTimeout(timer);
        resolve(r);
      });
      send({ type: STATUS, id, key: principal.id, limits: sent(principal) });
    });
}

/** Each distinct limits text (as a worker sends it) parsed once. */
function policyCache(): (limits: string) => Policy | null {
  const policies = new Map<string, Policy | null>();
  return (limits) => {
    let policy = policies.get(limits);
    if (policy === undefined) {
      // Sent by a worker from a key record its key set checked.
      policy = policyOf(JSON.parse(limits) as Limits | null);
      if (policies.size > 100_000) policies.clear();
      policies.set(limits, policy);
    }
    return policy;
  };
}

/** The primary's answer to a worker: refused, or admitted (held open until the worker reports the request done). */
function answered(worker: Worker, id: number, r: Admission | Refused, held: () => Map<number, Held>, what: Omit<Held, 'admission'>): void {
  if ('code' in r) {
    worker.send({ type: ADMITTED, id, refused: r } satisfies AdmittedMessage);
    return;
  }
  held().set(id, { admission: r, ...what });
  const budget = r.left !== undefined ? { reserved: r.reserved ?? 0, left: r.left } : {};
  worker.send({ type: ADMITTED, id, refused: null, ...budget } satisfies AdmittedMessage);
}

/** An admission the primary holds open for a worker's request. */
interface Held {
  readonly admission: Admission;
  readonly key: { id: string; name: string };
  readonly policy: Policy;
  readonly route: string;
}

/**
 * In the primary: decide for every worker with one limiter. `counted` is
 * told of every request that reached the upstream (the primary's period
 * totals: the workers write the ledger, the primary only counts). A worker
 * that exits with requests admitted gives their slots back; their quota
 * units and budget stay spent, as they may have reached the upstream.
 */
export function serveAdmissions(
  cluster: { on(event: 'message', l: (w: Worker, m: unknown) => void): unknown; on(event: 'exit', l: (w: Worker) => void): unknown },
  limiter: Limiter,
  share: () => number,
  counted: (key: { id: string; name: string }, policy: Policy, route: string, cost: number) => void,
  status: (keyId: string, policy: Policy) => readonly LimitState[] | Promise<readonly LimitState[]> = () => [],
): void {
  const policyFrom = policyCache();
  // Admissions a worker holds open, by its request id: given back when it reports the request done, or dies.
  const open = new Map<Worker, Map<number, Held>>();
  cluster.on('message', (worker, m) => {
    // Loosely typed on purpose: checked field by field below.
    const msg = m as {
      type?: unknown;
      id?: unknown;
      key?: unknown;
      name?: unknown;
      limits?: unknown;
      route?: unknown;
      now?: unknown;
      reached?: unknown;
      cost?: unknown;
    } | null;
    if (msg?.type === STATUS && typeof msg.id === 'number' && typeof msg.key === 'string' && typeof msg.limits === 'string') {
      const { id } = msg;
      const policy = policyFrom(msg.limits);
      const reply = (limits: readonly LimitState[]): void => void worker.send({ type: STATUS_RES, id, limits } satisfies StatusAnswer);
      const r = policy === null ? [] : status(msg.key, policy);
      if (r instanceof Promise) void r.then(reply, () => undefined);
      else reply(r);
    } else if (
      msg?.type === ADMIT &&
      typeof msg.id === 'number' &&
      typeof msg.key === 'string' &&
      typeof msg.route === 'string' &&
      typeof msg.limits === 'string'
    ) {
      const policy = policyFrom(msg.limits);
      const { id, route } = msg;
      const key = { id: msg.key, name: typeof msg.name === 'string' ? msg.name : msg.key };
      if (policy === null) return void worker.send({ type: ADMITTED, id, refused: null } satisfies AdmittedMessage);
      const answer = (r: Admission | Refused): void =>
        answered(
          worker,
          id,
          r,
          () => {
            let mine = open.get(worker);
            if (mine === undefined) open.set(worker, (mine = new Map<number, Held>()));
            return mine;
          },
          { key, policy, route },
        );
      const r = limiter.admit(key.id, policy, route, typeof msg.now === 'number' ? msg.now : Date.now(), share());
      // A fleet's lease may have to be claimed first.
      if (r instanceof Promise) detach(r.then(answer), neverRejects);
      else answer(r);
    } else if (msg?.type === DONE && typeof msg.id === 'number') {
      const held = open.get(worker)?.get(msg.id);
      if (held === undefined) return;
      open.get(worker)?.delete(msg.id);
      const reached = msg.reached === true;
      const cost = typeof msg.cost === 'number' && Number.isFinite(msg.cost) ? msg.cost : 0;
      // Counted before the reservation goes, in the same tick: admission never sees a gap.
      if (reached) counted(held.key, held.policy, held.route, cost);
      held.admission.done(reached, cost);
    }
  });
  cluster.on('exit', (worker) => {
    const mine = open.get(worker);
    open.delete(worker);
    if (mine === undefined) return;
    for (const { admission, key, policy, route } of mine.values()) {
      const estimate = limiter.estimate(key.id, route);
      counted(key, policy, route, estimate);
      admission.done(true, estimate);
    }
  });
}
