// Scraper runs settled after the fact (docs/limits.md, "Scraper runs"): the
// platform bills a run when it ends, and the response that starts it says
// nothing of the price. A run-start response is a run object; the ledger
// books the run's reservation with the request and records the run as
// pending (in the same write, ledger.ts), and this settler later asks the
// upstream itself, with the master credential, for the run until it ends,
// then books its real cost in place of the reservation, once. The questions
// never ride on a client's request: they run on a timer, a few at a time,
// with a backoff, and a run that never ends is given up at a stated age.
import { backoff, type Backoff } from '../lib/backoff.ts';
import { detach, neverRejects } from '../lib/detach.ts';
import { UNWATCHED, type Watch } from '../observe/outages.ts';

/** The statuses after which a run's cost no longer changes. */
export const TERMINAL: ReadonlySet<string> = new Set(['SUCCEEDED', 'FAILED', 'ABORTED', 'TIMED-OUT']);

/** A run whose cost is not booked yet. */
export interface PendingRun {
  readonly id: string;
  readonly keyId: string;
  readonly route: string;
  /** The UTC day of its start: its cost is booked to the key's row of that day. */
  readonly day: string;
  /** What was booked with the run-start request (its reservation; 0 for a key without a budget). */
  readonly booked: number;
  /** The upstream path to ask for it (`/v2/actor-runs/ID`). */
  readonly path: string;
  /** When it was started, ms. */
  readonly at: number;
  /** The route's credential (its label) that started it: the run is asked about with it (absent: 1). */
  readonly credential?: number;
}

export interface DueRun extends PendingRun {
  /** Questions asked of the upstream so far. */
  readonly attempts: number;
}

/** Where pending runs are kept: the ledger's store (the SQLite file, or PostgreSQL for a fleet). */
export interface RunStore {
  /** Runs due to be asked about at `now`, at most `limit`, claimed by `gateway` for `forMs` (nobody else asks meanwhile). */
  dueRuns(gateway: string, now: number, limit: number, forMs: number): Promise<DueRun[]>;
  /**
   * Book `cost` in place of what was booked at the start, on the run's day
   * row and the key's budget allowances, and forget the run, in one
   * transaction; false when it was settled already (by anyone).
   */
  settleRun(run: PendingRun, cost: number): Promise<boolean>;
  /** Ask again in `waitMs`; the claim ends. */
  deferRun(id: string, attempts: number, waitMs: number): Promise<void>;
  /** Given up: forgotten, what was booked at its start stays booked. */
  dropRun(id: string): Promise<boolean>;
  /** Pending runs by key, route and day (`keyward usage` marks those days). */
  pendingRuns(): Promise<Array<{ keyId: string; route: string; day: string; runs: number }>>;
}

/** The budget periods a day's cost falls in: the day and its month (an allowance's `period`). */
export const periodsOf = (day: string): [string, string] => [day, day.slice(0, 7)];

/** What a run-start response said of its run. */
export interface RunSeen {
  readonly id: string;
  readonly status: string;
  /** `usageTotalUsd`, when it is a non-negative number. */
  readonly usd: number | null;
}

/** A run id as the platform makes them (17 alphanumerics); anything else is not asked about. */
const RUN_ID = /^[A-Za-z0-9_-]{1,64}$/;

/** The run object of an answer (`{"data": {"id", "status", "usageTotalUsd"}}`), or null. */
export function runOf(body: unknown): RunSeen | null {
  if (typeof body !== 'object' || body === null) return null;
  const data = (body as { data?: unknown }).data;
  if (typeof data !== 'object' || data === null) return null;
  const { id, status, usageTotalUsd } = data as { id?: unknown; status?: unknown; usageTotalUsd?: unknown };
  if (typeof id !== 'string' || !RUN_ID.test(id) || typeof status !== 'string') return null;
  const usd = typeof usageTotalUsd === 'number' && Number.isFinite(usageTotalUsd) && usageTotalUsd >= 0 ? usageTotalUsd : null;
  return { id, status, usd };
}

/** The answer to `GET …/actor-runs/{id}`: the run, or why not. */
export type RunAnswer = { readonly run: RunSeen } | { readonly problem: string };

export interface SettlerOptions {
  readonly store: RunStore;
  readonly gateway: string;
  /** Ask the run's upstream about it (the master credential added); never rejects. */
  readonly ask: (run: PendingRun) => Promise<RunAnswer>;
  /** The most a run can plausibly cost, USD: a report above it counts as unusable. */
  readonly max: number;
  /** A run booked: its cost in place of `run.booked`. */
  readonly settled: (run: PendingRun, cost: number) => void;
  /** A question failed (the run stays pending, asked again later). */
  readonly failed: (run: DueRun, problem: string) => void;
  /** A run given up at `giveUpMs` of age: what was booked at its start stays. */
  readonly gaveUp: (run: DueRun) => void;
  /** How often pending runs are looked for, ms. */
  readonly everyMs?: number;
  /** Between questions about one run. */
  readonly backoff?: Backoff;
  /** A run older than this is given up. */
  readonly giveUpMs?: number;
  /** Questions in flight at once. */
  readonly concurrency?: number;
  /**
   * A round that fails is seen (observe/outages.ts): the store does not
   * answer, or every run asked about got no answer from the platform. Then
   * runs stop being booked at their cost, so it must not go unsaid.
   */
  readonly watch?: Watch;
}

/** Defaults (docs/limits.md, "Scraper runs"). */
export const SETTLE = {
  everyMs: 2_000,
  backoff: { firstMs: 5_000, maxMs: 5 * 60_000, jitter: 0.2 } satisfies Backoff,
  giveUpMs: 72 * 3_600_000,
  concurrency: 4,
  /** How long a gateway's claim on a run lasts (another gateway asks once it passed). */
  claimMs: 60_000,
} as const;

export class Settler {
  readonly #o: SettlerOptions;
  #timer: NodeJS.Timeout | null = null;
  #round: Promise<void> | null = null;
  #stopped = false;

  constructor(options: SettlerOptions) {
    this.#o = options;
  }

  start(): void {
    this.#timer = setInterval(() => detach(this.round(), neverRejects), this.#o.everyMs ?? SETTLE.everyMs);
    this.#timer.unref();
    detach(this.round(), neverRejects);
  }

  /** One look for due runs, each asked about once; one round at a time. */
  round(): Promise<void> {
    if (this.#stopped) return Promise.resolve();
    const watch = this.#o.watch ?? UNWATCHED;
    this.#round ??= this.#settle()
      .then(
        () => watch.ok(),
        (err: unknown) => watch.failed(err),
      )
      .finally(() => (this.#round = null));
    return this.#round;
  }

  async #settle(): Promise<void> {
    const o = this.#o;
    const due = await o.store.dueRuns(o.gateway, Date.now(), o.concurrency ?? SETTLE.concurrency, SETTLE.claimMs);
    const problems = (await Promise.all(due.map((run) => this.#one(run)))).filter((p) => p !== null);
    // Each run's problem is its own (counted, at debug); none of them answered is the platform's outage.
    if (due.length > 0 && problems.length === due.length) throw new Error(`no run of ${due.length} asked about was answered: ${problems[0]}`);
  }

  /** One run asked about: null when the platform answered it, else the problem. */
  async #one(run: DueRun): Promise<string | null> {
    const o = this.#o;
    const answer = await o.ask(run);
    let problem: string | null = null;
    if ('run' in answer && TERMINAL.has(answer.run.status)) {
      if (answer.run.usd !== null && answer.run.usd <= o.max) {
        if (await o.store.settleRun(run, answer.run.usd)) o.settled(run, answer.run.usd);
        return null;
      }
      problem = answer.run.usd === null ? 'the run ended with no usageTotalUsd' : 'the run reported an implausible cost';
    } else if ('problem' in answer) problem = answer.problem;
    if (problem !== null) o.failed(run, problem);
    const attempts = run.attempts + 1;
    if (Date.now() - run.at >= (o.giveUpMs ?? SETTLE.giveUpMs)) {
      if (await o.store.dropRun(run.id)) o.gaveUp(run);
      return problem;
    }
    await o.store.deferRun(run.id, attempts, backoff(attempts, o.backoff ?? SETTLE.backoff));
    return problem;
  }

  /** No more rounds; the one under way finishes (its questions have their own deadline). */
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer !== null) clearInterval(this.#timer);
    await this.#round;
  }
}
