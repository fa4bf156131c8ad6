// A task that runs in the background (a lease renewal, a lease claim, the
// run settler's round, an alert check, a key's figures read from the
// store) fails where no request sees it. Each is watched here, so none
// fails unseen (docs/operations.md, "Background tasks"): an outage is logged
// once when it starts and once when it ends (never once per attempt, which
// would flood the journal every flush), every failure is counted in
// `keyward_background_failures_total{task}`, and the tasks failing now are
// in `/readyz`. A failure that is a bug (a TypeError, say) rather than a
// store or a network that did not answer is logged at `error` with its
// stack: it is not an outage that ends by itself.
import { asError } from '../lib/error.ts';

export const TASKS = ['lease_renewal', 'lease_claim', 'run_settling', 'alert_check', 'usage_read', 'capacity_rebalance'] as const;
export type Task = (typeof TASKS)[number];

/** What a watched task reports: each failure, and each success (which ends an outage). */
export interface Watch {
  failed(err: unknown): void;
  ok(): void;
}

/** For a task nobody watches (a test's, a tool's). */
export const UNWATCHED: Watch = { failed: () => undefined, ok: () => undefined };

/** A task failing now, as `/readyz` lists it. */
export interface Failing {
  readonly task: Task;
  readonly since: string;
  readonly failures: number;
  readonly error: string;
}

interface Log {
  warn(fields: object, msg: string): void;
  error(fields: object, msg: string): void;
  info(fields: object, msg: string): void;
}

/** Thrown by the code itself, not by a store or a network: a bug, whatever the task. */
export const isBug = (err: unknown): boolean =>
  err instanceof TypeError || err instanceof RangeError || err instanceof ReferenceError || err instanceof SyntaxError;

export class Outages {
  readonly #log: Log;
  readonly #count: (task: Task) => void;
  readonly #now: () => number;
  readonly #open = new Map<Task, { since: number; failures: number; error: string }>();

  constructor(log: Log, count: (task: Task) => void, now: () => number = Date.now) {
    this.#log = log;
    this.#count = count;
    this.#now = now;
  }

  watch(task: Task): Watch {
    return { failed: (err) => this.#failed(task, err), ok: () => this.#ok(task) };
  }

  /** The tasks failing now, oldest outage first. */
  failing(): readonly Failing[] {
    return [...this.#open].map(([task, o]) => ({ task, since: new Date(o.since).toISOString(), failures: o.failures, error: o.error }));
  }

  #failed(task: Task, thrown: unknown): void {
    this.#count(task);
    const err = asError(thrown);
    const open = this.#open.get(task);
    if (open !== undefined) {
      open.failures++;
      open.error = err.message;
      return;
    }
    this.#open.set(task, { since: this.#now(), failures: 1, error: err.message });
    if (isBug(thrown)) this.#log.error({ task, err }, 'background task failed: a bug, not an outage; it is tried again at its next turn');
    else this.#log.warn({ task, err: err.message }, 'background task failing; tried again at its next turn, and said again when it works');
  }

  #ok(task: Task): void {
    const open = this.#open.get(task);
    if (open === undefined) return;
    this.#open.delete(task);
    this.#log.info({ task, failures: open.failures, forMs: this.#now() - open.since }, 'background task working again');
  }
}
