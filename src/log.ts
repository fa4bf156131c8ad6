// pino setup and the fixed log lines (design §6). The request line is the
// only per-request output; it carries ids and sizes, never a header value.
import pino, { type DestinationStream, type Logger } from 'pino';

export type { Logger };

export interface LogHandle {
  readonly logger: Logger;
  /** Write out anything buffered; call before the process exits. */
  flush(): void;
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
    return { logger: pino(options, destination), flush: () => undefined };
  }
  // Lines are gathered into 4 KiB writes (one asynchronous write per line cost
  // ~60 µs of CPU per request under load), and flushed at least once a second
  // so a quiet gateway's lines still reach the journal promptly.
  const dest = pino.destination({ dest: fd, sync: false, minLength: 4096 });
  const logger = pino(options, dest);
  const timer = setInterval(() => dest.flush(), 1000);
  timer.unref();
  return {
    logger,
    flush: () => {
      clearInterval(timer);
      try {
        dest.flushSync();
      } catch {
        // stdout already gone (EPIPE): nothing left to flush to.
      }
    },
  };
}
