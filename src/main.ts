// The process boundary: the only place that reads process.env or calls process.exit.
import { run } from './cli.ts';
import { UPSTREAMS } from './request/routes.ts';
import { asError } from './lib/error.ts';
import { EXIT_FAILURE } from './lib/io.ts';
import { isDriverConnectionLoss, isDriverWriteAfterClose } from './lib/driver-loss.ts';

// A rejection nobody handled is a flaw (the lint holds src/ to handling
// every promise): the process ends as Node's default would, but says which
// command it was, so that a line among several processes' output (a fleet
// walkthrough, a journal) can be traced to one. The one known exception is
// the PostgreSQL driver's own, on a connection lost while it set itself up
// (lib/driver-loss.ts): said, and the process goes on.
process.on('unhandledRejection', (err) => {
  if (isDriverConnectionLoss(err)) {
    process.stderr.write(
      `keyward ${process.argv[2] ?? ''} (pid ${process.pid}): a database connection was lost while the driver set it up (${asError(err).message}); it is replaced\n`,
    );
    return;
  }
  process.stderr.write(`keyward ${process.argv[2] ?? ''} (pid ${process.pid}): unexpected failure, please report it: ${asError(err).stack ?? String(err)}\n`);
  process.exit(EXIT_FAILURE);
});

// The driver's other known fault, thrown rather than rejected: a deferred
// write on a connection that has just closed (lib/driver-loss.ts). Said, and
// the process goes on; anything else thrown and not caught ends it as Node's
// default would, naming the command.
process.on('uncaughtException', (err) => {
  if (isDriverWriteAfterClose(err)) {
    process.stderr.write(
      `keyward ${process.argv[2] ?? ''} (pid ${process.pid}): the database driver wrote to a connection that had just closed; it is replaced\n`,
    );
    return;
  }
  process.stderr.write(`keyward ${process.argv[2] ?? ''} (pid ${process.pid}): unexpected failure, please report it: ${err.stack ?? String(err)}\n`);
  process.exit(EXIT_FAILURE);
});

// Output that cannot be written is a failure the exit status must carry
// (`keyward keys export > /dev/full`), except a reader that left (EPIPE:
// `keyward audit --json | head`), which is the reader's choice, not ours.
const output: { failed: Error | null } = { failed: null };
for (const stream of [process.stdout, process.stderr])
  stream.on('error', (err: NodeJS.ErrnoException) => {
    if (err.code !== 'EPIPE') output.failed ??= err;
  });

/**
 * Resolves once everything written so far has left `stream`. A pipe's writes
 * are asynchronous: process.exit with output still queued cuts it at the
 * pipe's buffer (64 KiB), so the exit waits for the queue to empty. An empty
 * write's callback runs after every earlier write's, or with the error that
 * ended the stream.
 */
function flushed(stream: NodeJS.WriteStream): Promise<void> {
  return new Promise((resolve) => stream.write('', () => resolve()));
}

const code = await run(
  process.argv.slice(2),
  {
    env: process.env,
    cwd: process.cwd(),
    pid: process.pid,
    stdout: process.stdout,
    stderr: process.stderr,
    signals: process,
  },
  UPSTREAMS,
);
await Promise.all([flushed(process.stdout), flushed(process.stderr)]);
if (output.failed !== null && code === 0) {
  process.stderr.write(`keyward: could not write the output: ${output.failed.message}\n`);
  await flushed(process.stderr);
  process.exit(EXIT_FAILURE);
}
process.exit(code);
