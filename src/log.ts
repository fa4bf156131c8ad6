// pino setup and the fixed log lines (design §6). The request line is the
// only per-request output; it carries ids and sizes, never a header value.
import pino, { type DestinationStream, type Logger } from 'pino';

export type { Logger };

export interface LogHandle {
  readonly logger: Logger;
  /** Write out anything buffered (at most a couple of seconds); await before the process exits. */
  flush(): Promise<void>;
}

/**
 * Logs go to stdout as JSON lines. The default destination is asynchronous
 * (SonicBoom with a buffer) so a slow journal never stalls the event loop;
 * `flush()` drains it synchronously on exit.
 */
export function createLogger(level: string, destination?: DestinationStream, fd: 1 | 2 = 1): LogHandle {
  // No `redact`: no code path logs a header, a URL query or a token (pipeline.ts
  // builds the request line from ids and sizes only), and redaction costs
  // several µs on every line.
  const options = { level, base: { service: 'keyward', pid: process.pid } };
  if (destination !== undefined) {
    return { logger: pino(options, destination), flush: () => Promise.resolve() };
  }
  // Lines are gathered into 4 KiB writes (one asynchronous write per line cost
  // ~60 µs of CPU per request under load), and flushed at least once a second
  // so a quiet gateway's lines still reach the journal promptly.
  const dest = pino.destination({ dest: fd, sync: false, minLength: 4096 });
  // A reader that went away (EPIPE: the journal restarted, `| head`) must
  // not stop the gateway, nor its exit: sonic-boom's flushSync retries every
  // write error but EAGAIN in a sleep loop forever, so the final flush is the
  // asynchronous one, with a deadline.
  let broken = false;
  dest.on('error', () => {
    broken = true;
  });
  const logger = pino(options, dest);
  const timer = setInterval(() => {
    if (!broken) dest.flush();
  }, 1000);
  timer.unref();
  return {
    logger,
    flush: () =>
      new Promise<void>((resolve) => {
        clearInterval(timer);
        if (broken) return resolve();
        const deadline = setTimeout(resolve, 2_000);
        try {
          dest.flush(() => {
            clearTimeout(deadline);
            resolve();
          });
        } catch {
          clearTimeout(deadline);
          resolve();
        }
      }),
  };
}
