// Where a key's limits are decided (docs/limits.md, "One key, one limit"):
// one place per machine. A single gateway process decides in-process. With
// KEYWARD_WORKERS > 1 the primary decides for every worker: a worker asks
// over the cluster's IPC channel for each request of a key that has limits
// and tells the primary when it is over, so rate, burst, concurrency, quota
// and budget hold for the machine as they do for one process. A key without
// limits never asks: its requests cost what they cost with one process.
import type { Worker } from 'node:cluster';
import type { Principal } from '../keys/keyset.ts';
import {
  pending,
  PROBE_WAIT_MS,
  whenDecided,
  type Admission,
  type Decision,
  type LimitState,
  type Limiter,
  type PaidStart,
  type Refused,
  type Undecided,
  type Verdict,
} from './limiter.ts';
import type { Limits } from '../keys/limits.ts';
import { policyOf, type Policy } from './policy.ts';

/** Admission for one request of a key with limits: at once, or after the primary answered. */
export type Admit = (principal: Principal, policy: Policy, route: string, now: number, start: PaidStart | null) => Verdict;

const ADMIT = 'keyward:admit';
const ADMITTED = 'keyward:admitted';
const DONE = 'keyward:done';
const CANCEL = 'keyward:cancel';
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
  /** A paid start's request (limiter.ts `PaidStart`); absent for any other call. */
  readonly start?: PaidStart;
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
  readonly refused: Refused | Undecided | null;
  /** An admission's budget figures (limiter.ts `reserved`, `cap`), when its route has a budget. */
  readonly reserved?: number;
  readonly cap?: number;
}
interface DoneMessage {
  readonly type: typeof DONE;
  readonly id: number;
  readonly reached: boolean;
  /** What the upstream reported; null: nothing (limiter.ts `Admission.done`). */
  readonly cost: number | null;
}
/** The worker stopped waiting: whatever the primary decides for this id is given back at once. */
interface CancelMessage {
  readonly type: typeof CANCEL;
  readonly id: number;
}

/**
 * How long a worker waits for the primary's answer, from what the primary
 * itself may wait for: its key's earlier calls' cost (PROBE_WAIT_MS), then
 * the ledger's store twice at most (`admissionWaitMs`, KEYWARD_ADMISSION_WAIT:
 * a fleet's figures for a paid start, then a lease claim), and half a second
 * for the messages themselves. A slow decision is never taken for a silent
 * primary; 5 s at the default wait.
 */
export const workerWaitMs = (admissionWaitMs: number): number => PROBE_WAIT_MS + 2 * admissionWaitMs + 500;
/** The primary did not answer in time (frozen, or gone): 503, nothing forwarded, nothing consumed. */
const NO_ANSWER: Undecided = { kind: 'undecided', code: 'admission_unavailable', retryAfter: 1 };

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

/** A budget figure from another process: a finite number, or absent. */
const figure = (n: unknown): number | undefined => (typeof n === 'number' && Number.isFinite(n) ? n : undefined);

/**
 * In a worker: ask the primary. `send` is the worker's IPC channel
 * (process.send); `on` subscribes to the primary's messages. A request the
 * worker stopped waiting for is cancelled, and an answer that comes after
 * that is given back at once: the primary never holds an admission nobody
 * holds.
 */
export function askPrimary(
  send: (m: AdmitMessage | DoneMessage | StatusMessage | CancelMessage) => void,
  on: (listener: (m: unknown) => void) => void,
  answerMs: number,
): Admit {
  let next = 0;
  const waiting = new Map<number, (msg: Partial<AdmittedMessage>) => void>();
  on((m) => {
    const msg = m as Partial<AdmittedMessage> | null;
    if (msg?.type !== ADMITTED || typeof msg.id !== 'number') return;
    const answer = waiting.get(msg.id);
    if (answer !== undefined) {
      waiting.delete(msg.id);
      return answer(msg);
    }
    // Admitted after this worker gave up on it: given back, never held.
    if (msg.refused === null) send({ type: DONE, id: msg.id, reached: false, cost: null });
  });
  return (principal, _policy, route, now, start) => {
    const id = ++next;
    const answered = new Promise<Decision>((resolve) => {
      const timer = setTimeout(() => {
        waiting.delete(id);
        send({ type: CANCEL, id });
        resolve(NO_ANSWER);
      }, answerMs);
      timer.unref();
      waiting.set(id, (msg) => {
        clearTimeout(timer);
        if (msg.refused !== null && msg.refused !== undefined) return resolve(msg.refused);
        let over = false;
        const done = (reached: boolean, cost: number | null): void => {
          if (over) return;
          over = true;
          send({ type: DONE, id, reached, cost });
        };
        const reserved = figure(msg.reserved);
        const cap = figure(msg.cap);
        resolve(
          cap !== undefined
            ? { kind: 'admitted', done, cap, reserved: reserved ?? cap }
            : reserved !== undefined
              ? { kind: 'admitted', done, reserved }
              : { kind: 'admitted', done },
        );
      });
      send({ type: ADMIT, id, key: principal.id, name: principal.name, limits: sent(principal), route, now, ...(start === null ? {} : { start }) });
    });
    return pending(answered);
  };
}

/**
 * In a worker: where a key's limits stand, asked of the primary that
 * decides them (GET /keyward/key); null when it does not answer in time.
 */
export function remoteStatus(
  send: (m: StatusMessage) => void,
  on: (listener: (m: unknown) => void) => void,
  answerMs: number,
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
      }, answerMs);
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

/** An admission the primary holds open for a worker's request. */
interface Held {
  readonly admission: Admission;
  readonly key: { id: string; name: string };
  readonly policy: Policy;
  readonly route: string;
}

/** A paid start as a worker sent it, checked field by field. */
function paidStart(v: unknown): PaidStart | null {
  if (typeof v !== 'object' || v === null) return null;
  const asked = (v as { asked?: unknown }).asked;
  return { asked: typeof asked === 'number' && Number.isFinite(asked) && asked >= 0 ? asked : null };
}

/** A worker's message as it arrives: loosely typed on purpose, checked field by field. */
interface Incoming {
  type?: unknown;
  id?: unknown;
  key?: unknown;
  name?: unknown;
  limits?: unknown;
  route?: unknown;
  now?: unknown;
  reached?: unknown;
  cost?: unknown;
  start?: unknown;
}

/**
 * In the primary: decide for every worker with one limiter. `counted` is
 * told of every request that reached the upstream (the primary's period
 * totals: the workers write the ledger, the primary only counts). A worker
 * that exits with requests admitted gives their slots back; their quota
 * units and budget stay spent, as they may have reached the upstream. A
 * request its worker cancelled (it stopped waiting) is given back the
 * moment it is decided, or at once if it was already.
 */
export function serveAdmissions(
  cluster: { on(event: 'message', l: (w: Worker, m: unknown) => void): unknown; on(event: 'exit', l: (w: Worker) => void): unknown },
  limiter: Limiter,
  share: () => number,
  counted: (key: { id: string; name: string }, policy: Policy, route: string, cost: number) => void,
  status: (keyId: string, policy: Policy) => readonly LimitState[] | Promise<readonly LimitState[]> = () => [],
): void {
  const primary = new PrimaryAdmissions(limiter, share, counted, status);
  cluster.on('message', (worker, m) => primary.message(worker, m as Incoming | null));
  cluster.on('exit', (worker) => primary.exited(worker));
}

class PrimaryAdmissions {
  readonly #limiter: Limiter;
  readonly #share: () => number;
  readonly #counted: (key: { id: string; name: string }, policy: Policy, route: string, cost: number) => void;
  readonly #status: (keyId: string, policy: Policy) => readonly LimitState[] | Promise<readonly LimitState[]>;
  readonly #policyFrom = policyCache();
  /** Admissions a worker holds open, by its request id: given back when it reports the request done, or dies. */
  readonly #open = new Map<Worker, Map<number, Held>>();
  /** Requests whose decision is under way (a lease claim, a first call's cost), and whether their worker cancelled them. */
  readonly #deciding = new Map<Worker, Map<number, boolean>>();

  constructor(
    limiter: Limiter,
    share: () => number,
    counted: (key: { id: string; name: string }, policy: Policy, route: string, cost: number) => void,
    status: (keyId: string, policy: Policy) => readonly LimitState[] | Promise<readonly LimitState[]>,
  ) {
    this.#limiter = limiter;
    this.#share = share;
    this.#counted = counted;
    this.#status = status;
  }

  message(worker: Worker, msg: Incoming | null): void {
    if (typeof msg?.id !== 'number') return;
    const id = msg.id;
    if (msg.type === STATUS && typeof msg.key === 'string' && typeof msg.limits === 'string') this.#answerStatus(worker, id, msg.key, msg.limits);
    else if (msg.type === ADMIT && typeof msg.key === 'string' && typeof msg.route === 'string' && typeof msg.limits === 'string')
      this.#decideFor(worker, id, { ...msg, key: msg.key, route: msg.route, limits: msg.limits });
    else if (msg.type === CANCEL) this.#cancel(worker, id);
    else if (msg.type === DONE) {
      const held = this.#take(worker, id);
      const cost = typeof msg.cost === 'number' && Number.isFinite(msg.cost) ? msg.cost : null;
      if (held !== undefined) this.#release(held, msg.reached === true, cost);
    }
  }

  exited(worker: Worker): void {
    const held = this.#open.get(worker);
    this.#open.delete(worker);
    // Decisions still under way for it are given back as they come: it can hold none.
    this.#deciding.delete(worker);
    for (const h of held?.values() ?? []) {
      // It may have reached the upstream: what it reserved stays spent.
      this.#release(h, true, h.admission.reserved ?? this.#limiter.estimate(h.key.id, h.route));
    }
  }

  #answerStatus(worker: Worker, id: number, keyId: string, limits: string): void {
    const policy = this.#policyFrom(limits);
    const reply = (states: readonly LimitState[]): void => void worker.send({ type: STATUS_RES, id, limits: states } satisfies StatusAnswer);
    // Answered in a later tick either way: a status is no request's admission.
    void Promise.resolve(policy === null ? [] : this.#status(keyId, policy)).then(reply, () => undefined);
  }

  #decideFor(worker: Worker, id: number, msg: Incoming & { key: string; route: string; limits: string }): void {
    const policy = this.#policyFrom(msg.limits);
    const route = msg.route;
    const key = { id: msg.key, name: typeof msg.name === 'string' ? msg.name : msg.key };
    if (policy === null) return void worker.send({ type: ADMITTED, id, refused: null } satisfies AdmittedMessage);
    // `later`: decided after a wait, during which the worker may have cancelled or exited (its entry gone).
    const answer = (r: Decision, later: boolean): void => {
      const cancelled = later && (this.#deciding.get(worker)?.get(id) ?? true);
      this.#deciding.get(worker)?.delete(id);
      if (r.kind !== 'admitted') return void (cancelled || worker.send({ type: ADMITTED, id, refused: r } satisfies AdmittedMessage));
      const held: Held = { admission: r, key, policy, route };
      // Nobody holds it: given back at once, never forwarded.
      if (cancelled || !worker.isConnected()) return this.#release(held, false, null);
      mine(this.#open, worker).set(id, held);
      const figures = { ...(r.reserved === undefined ? {} : { reserved: r.reserved }), ...(r.cap === undefined ? {} : { cap: r.cap }) };
      worker.send({ type: ADMITTED, id, refused: null, ...figures } satisfies AdmittedMessage);
    };
    const now = typeof msg.now === 'number' ? msg.now : Date.now();
    const r = this.#limiter.admit(key.id, policy, route, now, this.#share(), paidStart(msg.start));
    if (r.kind !== 'pending') return answer(r, false);
    mine(this.#deciding, worker).set(id, false);
    whenDecided(r, (decided) => answer(decided, true));
  }

  #cancel(worker: Worker, id: number): void {
    const deciding = this.#deciding.get(worker);
    if (deciding?.has(id) === true) return void deciding.set(id, true);
    const held = this.#take(worker, id);
    if (held !== undefined) this.#release(held, false, null);
  }

  #take(worker: Worker, id: number): Held | undefined {
    const held = this.#open.get(worker)?.get(id);
    if (held !== undefined) this.#open.get(worker)?.delete(id);
    return held;
  }

  #release(held: Held, reached: boolean, cost: number | null): void {
    // Counted before the reservation goes, in the same tick: admission never sees a gap.
    if (reached) this.#counted(held.key, held.policy, held.route, cost ?? 0);
    held.admission.done(reached, cost);
  }
}

function mine<V>(all: Map<Worker, Map<number, V>>, worker: Worker): Map<number, V> {
  let m = all.get(worker);
  if (m === undefined) all.set(worker, (m = new Map<number, V>()));
  return m;
}
