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
  const options = {
    level,
    base: { service: 'keyward' },
    // Belt and braces: no code path logs these, and if one ever did they would be blanked.
    redact: { paths: ['authorization', '*.authorization', 'headers', '*.headers', 'token', '*.token'], censor: '[redacted]' },
  };
  if (destination !== undefined) {
    return { logger: pino(options, destination), flush: () => undefined };
  }
  const dest = pino.destination({ dest: fd, sync: false, minLength: 0 });
  const logger = pino(options, dest);
  return {
    logger,
    flush: () => {
      try {
        dest.flushSync();
      } catch {
        // stdout already gone (EPIPE): nothing left to flush to.
      }
    },
  };
}
