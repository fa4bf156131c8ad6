// KEYWARD_WORKERS > 1: a primary process forks that many gateway workers
// with node:cluster; the kernel-facing listener is shared and connections
// are handed to workers round-robin.
//
// Workers never write to the journal themselves: several processes writing
// one stream can interleave partial lines once writes exceed the pipe's
// atomic size. Each worker's stdout is a pipe to the primary, which relays
// whole lines only. Signals go to the primary (systemd's MainPID): SIGTERM
// and SIGINT are passed on and the primary exits 0 once every worker has
// drained; SIGHUP is passed on (keys reload).
import cluster, { type Worker } from 'node:cluster';
import type { Readable, Writable } from 'node:stream';

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

const QUICK_DEATH_MS = 1_000;

/** Run the primary: fork `count` workers running `args`, relay their logs, pass signals on. */
export function runPrimary(count: number, args: readonly string[], io: PrimaryIo): Promise<number> {
  cluster.setupPrimary({ args: [...args], stdio: ['ignore', 'pipe', 'inherit', 'ipc'] });
  const started = new Map<Worker, number>();
  let stopping = false;
  let exitCode = 0;
  const fork = (): void => {
    const w = cluster.fork();
    started.set(w, Date.now());
    if (w.process.stdout) relayLines(w.process.stdout, io.stdout);
  };
  const stopAll = (): void => {
    stopping = true;
    for (const w of started.keys()) w.process.kill('SIGTERM');
  };
  for (let i = 0; i < count; i++) fork();

  return new Promise((resolve) => {
    cluster.on('exit', (worker, code, signal) => {
      const lived = Date.now() - (started.get(worker) ?? 0);
      started.delete(worker);
      if (!stopping) {
        io.stderr.write(`keyward: worker ${worker.process.pid} exited (${signal ?? code})\n`);
        if (code === 2 || lived < QUICK_DEATH_MS) {
          // A configuration error, or a worker that cannot even start: every
          // replacement would fail the same way, so stop instead of looping.
          exitCode = code === 2 ? 2 : 1;
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
      for (const w of started.keys()) w.process.kill('SIGHUP');
    });
  });
}
