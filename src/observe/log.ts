// pino setup and the fixed log lines (docs/logs.md). The request line is the
// only per-request output; it carries ids and sizes, never a header value.
import pino, { type DestinationStream, type Logger } from 'pino';
import { lineBound, writeLine, type RequestFields } from './line-bytes.ts';

export type { RequestFields };

export type { Logger };

/** The destination's entry for request lines, which are written into its batch buffer as bytes. */
const BATCHED = Symbol('keyward.batched');

interface Batched {
  /** `time`: pino's time piece, or null for the epoch time in ms. */
  request(level: number, time: string | null, bindings: string, f: RequestFields): void;
}

export interface LogHandle {
  readonly logger: Logger;
  /** Told how long each batched write held the event loop, in seconds (metrics). */
  timed(report: (seconds: number) => void): void;
  /** Write out anything buffered (at most a couple of seconds); await before the process exits. */
  flush(): Promise<void>;
}

/**
 * Logs go to stdout as JSON lines. The default destination is asynchronous
 * (SonicBoom with a buffer) so a slow journal never stalls the event loop;
 * `flush()` drains it before exit, asynchronously and with a deadline (see
 * LineBatcher for why not synchronously).
 */
export function createLogger(level: string, destination?: DestinationStream, fd: 1 | 2 = 1): LogHandle {
  // No `redact`: no code path logs a header, a URL query or a token (the
  // request line, built here from ids and sizes for completion.ts, carries
  // none), and redaction would walk every line's object on the request path.
  const options = { level, base: { service: 'keyward', pid: process.pid } };
  if (destination !== undefined) {
    return { logger: pino(options, destination), timed: () => undefined, flush: () => Promise.resolve() };
  }
  const batcher = new LineBatcher(pino.destination({ dest: fd, sync: false, minLength: 4096, contentMode: 'buffer' }));
  const batched = {
    // pino's own lines (start, reload, errors: rare) are passed on at once,
    // after the request lines before them.
    write(line: string): boolean {
      batcher.append(line);
      batcher.drain();
      return true;
    },
    [BATCHED]: batcher satisfies Batched,
  };
  const timer = setInterval(() => batcher.tick(), 1000);
  timer.unref();
  return {
    logger: pino(options, batched),
    timed: (r) => {
      batcher.report = r;
    },
    flush: () => {
      clearInterval(timer);
      return batcher.flush();
    },
  };
}

const SIZE = 65_536;
const FULL = 32_768;
/** Less than this is handed on as a copy, and the buffer kept: pino's own lines drain one at a time. */
const SMALL = 4_096;

/**
 * Lines are copied as they come into a 64 KiB buffer outside the V8 heap,
 * which goes to SonicBoom in one write once 32 KiB are gathered (and at least
 * once a second, so a quiet gateway's lines still reach the journal
 * promptly). Held as strings until written, lines outlive young-generation
 * collections and are copied by each; written one by one, or a few KiB at a
 * time, each write wakes a thread of libuv's pool and then the event loop.
 * Both cost more than the line itself (the figures: bench/README.md, "Log
 * line"). pino's own lines pass through here as well, so the order of all
 * lines is kept.
 */
class LineBatcher {
  #buf = Buffer.allocUnsafe(SIZE);
  #used = 0;
  #broken = false;
  report: (seconds: number) => void = () => undefined;
  readonly #dest: ReturnType<typeof pino.destination>;

  constructor(dest: ReturnType<typeof pino.destination>) {
    this.#dest = dest;
    // A reader that went away (EPIPE: the journal restarted, `| head`) must
    // not stop the gateway, nor its exit: sonic-boom's flushSync retries every
    // write error but EAGAIN in a sleep loop forever, so the final flush is the
    // asynchronous one, with a deadline.
    dest.on('error', () => {
      this.#broken = true;
    });
  }

  append(line: string): void {
    // At most three bytes per UTF-16 unit: room is checked without measuring.
    if (this.#used + line.length * 3 > SIZE) {
      this.drain();
      if (line.length * 3 > SIZE) return this.#hand(Buffer.from(line));
    }
    this.#used += this.#buf.write(line, this.#used, 'utf8');
    if (this.#used >= FULL) this.drain();
  }

  /** The request line, written as bytes where it goes (line-bytes.ts); a line too long for the buffer goes as a string. */
  request(level: number, time: string | null, bindings: string, f: RequestFields): void {
    const bound = lineBound(time, bindings, f);
    if (this.#used + bound > SIZE) {
      this.drain();
      if (bound > SIZE) return this.append(templateLine(level, time ?? `,"time":${Date.now()}`, bindings, f));
    }
    this.#used = writeLine(this.#buf, this.#used, level, time, bindings, f);
    if (this.#used >= FULL) this.drain();
  }

  drain(): void {
    if (this.#used === 0) return;
    let out: Buffer;
    if (this.#used < SMALL) {
      out = Buffer.from(this.#buf.subarray(0, this.#used));
    } else {
      out = this.#buf.subarray(0, this.#used);
      this.#buf = Buffer.allocUnsafe(SIZE);
    }
    this.#used = 0;
    this.#hand(out);
  }

  /** Once a second: what is gathered goes out, and SonicBoom writes its own buffer. */
  tick(): void {
    this.drain();
    if (!this.#broken) this.#dest.flush();
  }

  /** Everything out, within two seconds. */
  flush(): Promise<void> {
    return new Promise<void>((resolve) => {
      this.drain();
      if (this.#broken) return resolve();
      const deadline = setTimeout(resolve, 2_000);
      try {
        this.#dest.flush(() => {
          clearTimeout(deadline);
          resolve();
        });
      } catch {
        clearTimeout(deadline);
        resolve();
      }
    });
  }

  #hand(out: Buffer): void {
    if (this.#broken) return;
    const start = performance.now();
    try {
      this.#dest.write(out as unknown as string);
    } catch {
      this.#broken = true; // a destination that failed: lines are dropped, the gateway goes on
    }
    this.report((performance.now() - start) / 1000);
  }
}

export type RequestLevel = 'info' | 'warn' | 'error';

const LEVEL_VALUES: Readonly<Record<RequestLevel, number>> = { info: 30, warn: 40, error: 50 };
const str = (s: string | null): string => (s === null ? 'null' : JSON.stringify(s));

/**
 * The request line, serialised by a fixed template and written straight to
 * the logger's own destination: the same bytes pino writes for
 * `logger[level](fields, 'request completed')` (level, time, the logger's
 * bindings, the fields, msg) without pino's generic per-key walk, a cost on
 * every line (bench/README.md). The level is read from the logger on
 * every call, so a reload that changes it applies at once. A destination
 * that needs pino's metadata (multistream) gets the ordinary call.
 */
export function requestLogger(logger: Logger): (level: RequestLevel, f: RequestFields) => void {
  const stream = (logger as unknown as Record<symbol, { write(s: string): unknown; [k: symbol]: unknown }>)[pino.symbols.streamSym];
  if (stream === undefined || stream[pino.symbols.needsMetadataGsym] === true) {
    return (level, f) => logger[level](f, 'request completed');
  }
  const internals = logger as unknown as Record<symbol, unknown>;
  const batched = stream[BATCHED] as Batched | undefined;
  if (batched !== undefined) {
    return (level, f) => {
      if (LEVEL_VALUES[level] < logger.levelVal) return;
      const time = internals[pino.symbols.timeSym] as () => string;
      batched.request(LEVEL_VALUES[level], time === pino.stdTimeFunctions.epochTime ? null : time(), internals[pino.symbols.chindingsSym] as string, f);
    };
  }
  return (level, f) => {
    if (LEVEL_VALUES[level] < logger.levelVal) return;
    const time = (internals[pino.symbols.timeSym] as () => string)();
    stream.write(templateLine(LEVEL_VALUES[level], time, internals[pino.symbols.chindingsSym] as string, f));
  };
}

/** The request line as pino would write it: level, time, the logger's bindings, the fields, msg. */
export function templateLine(level: number, time: string, bindings: string, f: RequestFields): string {
  return `{"level":${level}${time}${bindings},"reqId":${str(f.reqId)},"traceId":${str(f.traceId)},"client":${str(f.client)},"keyId":${str(f.keyId)},"keyName":${str(f.keyName)},"route":${str(f.route)},"method":${str(f.method)},"path":${str(f.path)},"status":${f.status},"bytesIn":${f.bytesIn},"bytesOut":${f.bytesOut},"durationMs":${f.durationMs},"ttfbMs":${f.ttfbMs},"queuedMs":${f.queuedMs},"error":${str(f.error)},"authFailure":${str(f.authFailure)},"credential":${f.credential},"refusedBy":${str(f.refusedBy)},"aborted":${f.aborted},"msg":"request completed"}\n`;
}
