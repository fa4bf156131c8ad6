// Room on the accounts with KEYWARD_WORKERS > 1 (docs/credentials.md,
// "Capacity"): the primary holds each credential's count and the queue for
// the whole machine, so the bound and the fairness between keys hold as
// they do in one process. A worker asks over the cluster's IPC channel for
// each request of a route with a capacity, and says when it is over. A
// worker that exits gives back everything it held and leaves the queue; an
// answer that crosses a worker's cancel is given back by the worker.
import type { Worker } from 'node:cluster';
import type { Answer, Capacity, Room } from './capacity.ts';

const ASK = 'keyward:room-ask';
const ANSWER = 'keyward:room';
const CANCEL = 'keyward:room-cancel';
const RELEASE = 'keyward:room-release';

interface AskMessage {
  readonly type: typeof ASK;
  readonly id: number;
  readonly route: string;
  readonly key: string;
  readonly front: boolean;
}
interface AnswerMessage {
  readonly type: typeof ANSWER;
  readonly id: number;
  readonly route: string;
  readonly label: number;
  readonly retryAfter: number;
  readonly waitedMs: number;
}
interface CancelMessage {
  readonly type: typeof CANCEL;
  readonly id: number;
}
interface ReleaseMessage {
  readonly type: typeof RELEASE;
  readonly route: string;
  readonly label: number;
}
type ToPrimary = AskMessage | CancelMessage | ReleaseMessage;

/** A worker's request waiting for its primary's answer. */
interface Asked {
  readonly id: number;
  readonly answer: Answer;
  readonly timer: ReturnType<typeof setTimeout>;
}

/**
 * In a worker: room asked of the primary. `answerMs` bounds the wait for an
 * answer (the queue's wait and a second for the messages): a primary that
 * does not answer in time is taken as no room (503 upstream_busy).
 */
export function askPrimaryForRoom(send: (m: ToPrimary) => void, on: (listener: (m: unknown) => void) => void, answerMs: number): Room {
  let next = 0;
  const waiting = new Map<number, Asked>();
  on((m) => {
    const msg = m as Partial<AnswerMessage> | null;
    if (msg?.type !== ANSWER || typeof msg.id !== 'number' || typeof msg.route !== 'string' || typeof msg.label !== 'number') return;
    const asked = waiting.get(msg.id);
    if (asked === undefined) {
      // Granted after this worker stopped waiting: given back, never held.
      if (msg.label > 0) send({ type: RELEASE, route: msg.route, label: msg.label });
      return;
    }
    waiting.delete(msg.id);
    clearTimeout(asked.timer);
    asked.answer(msg.label, typeof msg.retryAfter === 'number' ? msg.retryAfter : 1, typeof msg.waitedMs === 'number' ? msg.waitedMs : -1);
  });
  return {
    ask(route, key, front, answer) {
      const id = ++next;
      const timer = setTimeout(() => {
        waiting.delete(id);
        send({ type: CANCEL, id });
        answer(0, 1, answerMs);
      }, answerMs);
      timer.unref();
      const asked: Asked = { id, answer, timer };
      waiting.set(id, asked);
      send({ type: ASK, id, route, key, front });
      return asked;
    },
    cancel(_route, ticket) {
      const asked = ticket as Asked;
      if (!waiting.delete(asked.id)) return;
      clearTimeout(asked.timer);
      send({ type: CANCEL, id: asked.id });
    },
    release(route, label) {
      send({ type: RELEASE, route, label });
    },
  };
}

/** A worker's message as it arrives: loosely typed on purpose, checked field by field. */
interface Incoming {
  type?: unknown;
  id?: unknown;
  route?: unknown;
  key?: unknown;
  front?: unknown;
  label?: unknown;
}

/** What one worker holds at the primary: requests waiting (by id), and room taken (by route and credential). */
interface Held {
  readonly waiting: Map<number, { readonly route: string; readonly ticket: object }>;
  readonly taken: Map<string, number>;
}

const slot = (route: string, label: number): string => `${route}\u0000${label}`;

/** In the primary: the machine's room, asked for by every worker. */
export function serveRoom(
  cluster: { on(event: 'message', l: (w: Worker, m: unknown) => void): unknown; on(event: 'exit', l: (w: Worker) => void): unknown },
  capacity: Capacity,
): void {
  const held = new Map<Worker, Held>();
  const of = (w: Worker): Held => {
    let h = held.get(w);
    if (h === undefined) held.set(w, (h = { waiting: new Map(), taken: new Map() }));
    return h;
  };
  const give = (h: Held, route: string, label: number): void => {
    const k = slot(route, label);
    const n = h.taken.get(k) ?? 0;
    // Never more than the worker holds: a stray or repeated release cannot free another's room.
    if (n <= 0) return;
    if (n === 1) h.taken.delete(k);
    else h.taken.set(k, n - 1);
    capacity.release(route, label);
  };
  cluster.on('message', (w, m) => {
    const msg = m as Incoming | null;
    if (msg?.type === ASK && typeof msg.id === 'number' && typeof msg.route === 'string' && typeof msg.key === 'string') {
      const { id, route } = msg;
      const h = of(w);
      let answered = false;
      const ticket = capacity.ask(route, msg.key, msg.front === true, (label, retryAfter, waitedMs) => {
        answered = true;
        h.waiting.delete(id);
        if (label > 0 && !w.isConnected()) return capacity.release(route, label);
        if (label > 0) h.taken.set(slot(route, label), (h.taken.get(slot(route, label)) ?? 0) + 1);
        w.send({ type: ANSWER, id, route, label, retryAfter, waitedMs } satisfies AnswerMessage);
      });
      if (!answered && ticket !== null) h.waiting.set(id, { route, ticket });
    } else if (msg?.type === CANCEL && typeof msg.id === 'number') {
      const h = held.get(w);
      const waiting = h?.waiting.get(msg.id);
      if (h === undefined || waiting === undefined) return;
      h.waiting.delete(msg.id);
      capacity.cancel(waiting.route, waiting.ticket);
    } else if (msg?.type === RELEASE && typeof msg.route === 'string' && typeof msg.label === 'number') {
      const h = held.get(w);
      if (h !== undefined) give(h, msg.route, msg.label);
    }
  });
  cluster.on('exit', (w) => {
    const h = held.get(w);
    held.delete(w);
    if (h === undefined) return;
    // Its connections closed with it, and with them its requests to the upstream.
    for (const { route, ticket } of h.waiting.values()) capacity.cancel(route, ticket);
    for (const [k, n] of h.taken) {
      const [route, label] = k.split('\u0000') as [string, string];
      for (let i = 0; i < n; i++) capacity.release(route, Number(label));
    }
  });
}
