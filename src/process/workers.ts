// KEYWARD_WORKERS > 1: a primary process forks that many gateway workers
// with node:cluster; the kernel-facing listener is shared and connections
// are handed to workers round-robin.
//
// Workers never write to the journal themselves: several processes writing
// one stream can interleave partial lines once writes exceed the pipe's
// atomic size. Each worker's stdout is a pipe to the primary, which relays
// whole lines only. Signals go to the primary (systemd's MainPID): SIGTERM
// and SIGINT are passed on and the primary exits 0 once every worker has
// drained; SIGHUP is passed on (configuration and keys reload).
//
// The admin listener runs in the primary: /metrics is the sum over workers
// (prom-client's AggregatorRegistry asks each one over the IPC channel) and
// /readyz is ready when every worker is.
import cluster, { type Worker } from 'node:cluster';
import type { Readable, Writable } from 'node:stream';
import { EXIT_FAILURE, EXIT_USAGE } from '../lib/io.ts';
import type { Readiness } from './server.ts';
import { askPrimary, remoteStatus, serveAdmissions, workerWaitMs, type Admit } from '../limits/admissions.ts';
import type { LimitState, Limiter } from '../limits/limiter.ts';
import type { Principal } from '../keys/keyset.ts';
import type { Policy } from '../limits/policy.ts';
import { applyAside, relayAmongWorkers } from './credential-share.ts';
import { askPrimaryForRoom, serveRoom } from '../capacity/workers.ts';
import type { Capacity, Room } from '../capacity/capacity.ts';
import type { CredentialBoard } from '../request/credentials.ts';

/** In a worker: admission for keys with limits, asked of the primary; `admissionWaitMs` (KEYWARD_ADMISSION_WAIT) sets how long it is waited for. */
export function primaryAdmit(admissionWaitMs: number): Admit {
  return askPrimary(
    (m) => process.send?.(m),
    (listener) => process.on('message', listener),
    workerWaitMs(admissionWaitMs),
  );
}

/** In a worker: room on the routes' accounts, asked of the primary; waited for as long as the queue's wait and a second more. */
export function primaryRoom(queueWaitMs: number): Room {
  return askPrimaryForRoom(
    (m) => process.send?.(m),
    (listener) => process.on('message', listener),
    queueWaitMs + 1_000,
  );
}

/**
 * In the primary: the machine's room on the routes' accounts (capacity/workers.ts),
 * with what the workers set aside applied to the board it chooses with.
 */
export function holdRoomForWorkers(capacity: Capacity, board: CredentialBoard): void {
  serveRoom(cluster, capacity);
  cluster.on('message', (_w, m) => applyAside(board, m));
}

/** In a worker: where a key's limits stand, asked of the primary. */
export function primaryStatus(admissionWaitMs: number): (principal: Principal) => Promise<readonly LimitState[] | null> {
  return remoteStatus(
    (m) => process.send?.(m),
    (listener) => process.on('message', listener),
    workerWaitMs(admissionWaitMs),
  );
}

/** In the primary: decide admissions for every worker, and answer where a key's limits stand (limits/admissions.ts). */
export function decideForWorkers(
  limiter: Limiter,
  share: () => number,
  counted: (key: { id: string; name: string }, policy: Policy, route: string, cost: number) => void,
  status: (keyId: string, policy: Policy) => readonly LimitState[] | Promise<readonly LimitState[]>,
): void {
  serveAdmissions(cluster, limiter, share, counted, status);
}

/** Relay `source` to `sink` one whole line at a time (a partial tail waits for its newline). */
export function relayLines(source: Readable, sink: Writable): void {
  let tail = '';
  source.setEncoding('utf8');
  source.on('data', (chunk: string) => {
    const text = tail + chunk;
    const end = text.lastIndexOf('\n');
    if (end < 0) {
      tail = text;
      return;
    }
    sink.write(text.slice(0, end + 1));
    tail = text.slice(end + 1);
  });
  source.on('end', () => {
    if (tail !== '') sink.write(`${tail}\n`);
  });
}

export interface PrimaryIo {
  readonly stdout: Writable;
  readonly stderr: Writable;
  readonly signals: NodeJS.EventEmitter;
}

export interface Primary {
  /** Resolves with the exit code once every worker has stopped. */
  readonly done: Promise<number>;
  /** Ready when every expected worker answers that it is. */
  readiness(): Promise<Readiness>;
}

const QUICK_DEATH_MS = 1_000;
const READINESS_REQ = 'keyward:readiness';
const READINESS_RES = 'keyward:readiness-res';

/** In a worker: answer the primary's readiness questions. */
export function answerReadiness(readiness: () => Readiness): void {
  process.on('message', (m: { type?: string; id?: number }) => {
    if (m?.type === READINESS_REQ) process.send?.({ type: READINESS_RES, id: m.id, readiness: readiness() });
  });
}

/** The machine's readiness from its workers' answers: ready when all `count` are. */
function machineReadiness(answers: readonly Readiness[], count: number, stopping: boolean): Readiness {
  const notReady = answers.find((a) => !a.ready);
  const keys = answers.length > 0 ? Math.min(...answers.map((a) => a.keys ?? 0)) : null;
  if (stopping) return { ready: false, draining: true, keys, reason: 'draining' };
  if (answers.length < count) return { ready: false, draining: false, keys, reason: `${answers.length} of ${count} workers ready` };
  if (notReady !== undefined) return notReady;
  const unsupported = Math.max(0, ...answers.map((a) => a.keysUnsupported ?? 0));
  // What any worker names (a damaged ledger, a store it cannot reach) is the machine's: said once each.
  const problems = [...new Set(answers.flatMap((a) => (a.problem === undefined ? [] : a.problem.split('; '))))];
  const stale = answers.some((a) => a.stale === true);
  // Every worker holds the same credentials set aside: the first answer's stand for the machine's.
  const { credentials, credentialsExhausted } = answers[0] ?? {};
  return {
    ready: true,
    draining: false,
    keys,
    ...(unsupported > 0 ? { keysUnsupported: unsupported } : {}),
    ...(stale ? { stale } : {}),
    ...(problems.length > 0 ? { problem: problems.join('; ') } : {}),
    ...(credentials === undefined ? {} : { credentials }),
    ...(credentialsExhausted === undefined ? {} : { credentialsExhausted }),
  };
}

/**
 * Run the primary: fork `count` workers running `args`, relay their logs,
 * pass signals on. `env` is added to each worker's environment.
 */
export function runPrimary(count: number, args: readonly string[], io: PrimaryIo, env: Record<string, string> = {}): Primary {
  cluster.setupPrimary({ args: [...args], stdio: ['ignore', 'pipe', 'inherit', 'ipc'] });
  const started = new Map<Worker, number>();
  // Workers that got as far as listening: one that exits before that cannot
  // start at all (port taken, a store it cannot open), however long its
  // start took on a busy machine.
  const listened = new WeakSet<Worker>();
  cluster.on('listening', (w) => listened.add(w));
  // Credentials set aside by one worker, passed to the others (credential-share.ts).
  const credentials = relayAmongWorkers(() => started.keys());
  cluster.on('message', (w, m) => credentials.seen(w, m));
  cluster.on('online', (w) => credentials.joined(w));
  let stopping = false;
  let exitCode = 0;
  let asked = 0;
  const fork = (): void => {
    const w = cluster.fork(env);
    started.set(w, Date.now());
    if (w.process.stdout) relayLines(w.process.stdout, io.stdout);
  };
  const stopAll = (): void => {
    stopping = true;
    for (const w of started.keys()) w.process.kill('SIGTERM');
  };
  for (let i = 0; i < count; i++) fork();

  const readiness = (): Promise<Readiness> => {
    const id = ++asked;
    const workers = [...started.keys()].filter((w) => w.isConnected());
    return new Promise<Readiness>((resolve) => {
      const answers: Readiness[] = [];
      const finish = (): void => {
        cluster.off('message', onMessage);
        clearTimeout(timer);
        resolve(machineReadiness(answers, count, stopping));
      };
      const onMessage = (_w: Worker, m: { type?: string; id?: number; readiness?: Readiness }): void => {
        if (m?.type !== READINESS_RES || m.id !== id || m.readiness === undefined) return;
        answers.push(m.readiness);
        if (answers.length === workers.length) finish();
      };
      const timer = setTimeout(finish, 1_000);
      cluster.on('message', onMessage);
      for (const w of workers) w.send({ type: READINESS_REQ, id });
      if (workers.length === 0) finish();
    });
  };

  const done = new Promise<number>((resolve) => {
    cluster.on('exit', (worker, code, signal) => {
      const lived = Date.now() - (started.get(worker) ?? 0);
      started.delete(worker);
      if (!stopping) {
        io.stderr.write(`keyward: worker ${worker.process.pid} exited (${signal ?? code})\n`);
        if (code === EXIT_USAGE || !listened.has(worker) || lived < QUICK_DEATH_MS) {
          // A configuration error, or a worker that cannot even start: every
          // replacement would fail the same way, so stop instead of looping.
          exitCode = code === EXIT_USAGE ? EXIT_USAGE : EXIT_FAILURE;
          stopAll();
        } else {
          fork(); // one crash never takes the service down
        }
      }
      if (stopping && started.size === 0) resolve(exitCode);
    });
    io.signals.on('SIGTERM', stopAll);
    io.signals.on('SIGINT', stopAll);
    io.signals.on('SIGHUP', () => {
      credentials.reloaded();
      for (const w of started.keys()) w.process.kill('SIGHUP');
    });
  });
  return { done, readiness };
}
