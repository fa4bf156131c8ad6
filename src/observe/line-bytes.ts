// The request line written as bytes straight into the log's batch buffer,
// the same bytes as the line's template string (log.ts). Built as a string,
// the line is dozens of pieces joined and flattened, garbage on every request
// that the young generation must collect (bench/README.md, "The young
// generation", has the counts). Here a line allocates nothing but what its
// numbers and its rare non-ASCII text need.

/** The fields of the per-request line (docs/logs.md), in the order they are written. */
export interface RequestFields {
  readonly reqId: string;
  /** The trace id of the client's W3C traceparent, when well formed (trace.ts); null otherwise. */
  readonly traceId: string | null;
  readonly client: string | null;
  readonly keyId: string | null;
  readonly keyName: string | null;
  readonly route: string | null;
  readonly method: string;
  readonly path: string;
  readonly status: number | null;
  readonly bytesIn: number | null;
  readonly bytesOut: number;
  readonly durationMs: number;
  readonly ttfbMs: number | null;
  /** How long the request waited for room on its upstream's accounts (docs/credentials.md, "Capacity"); null when it did not wait. */
  readonly queuedMs: number | null;
  readonly error: string | null;
  /** Why a token was refused (401): missing, malformed, unknown, revoked or expired; null otherwise. */
  readonly authFailure: string | null;
  /** On a route with several credentials: the number of the one that answered (docs/credentials.md); null otherwise. */
  readonly credential: number | null;
  /** The credentials refused before it, `number:status` joined by commas (`1:429,2:402`); null when none was. */
  readonly refusedBy: string | null;
  readonly aborted: boolean;
}

/** The ASCII bytes of a constant piece of the line. */
const ascii = (s: string): Uint8Array => Uint8Array.from(s, (c) => c.charCodeAt(0));

const LEVEL_OPEN = ascii('{"level":');
const TIME = ascii(',"time":');
const REQ_ID = ascii(',"reqId":');
const TRACE_ID = ascii(',"traceId":');
const CLIENT = ascii(',"client":');
const KEY_ID = ascii(',"keyId":');
const KEY_NAME = ascii(',"keyName":');
const ROUTE = ascii(',"route":');
const METHOD = ascii(',"method":');
const PATH = ascii(',"path":');
const STATUS = ascii(',"status":');
const BYTES_IN = ascii(',"bytesIn":');
const BYTES_OUT = ascii(',"bytesOut":');
const DURATION = ascii(',"durationMs":');
const TTFB = ascii(',"ttfbMs":');
const QUEUED = ascii(',"queuedMs":');
const ERROR = ascii(',"error":');
const AUTH_FAILURE = ascii(',"authFailure":');
const CREDENTIAL = ascii(',"credential":');
const REFUSED_BY = ascii(',"refusedBy":');
const ABORTED = ascii(',"aborted":');
const KEYS = [
  REQ_ID,
  TRACE_ID,
  CLIENT,
  KEY_ID,
  KEY_NAME,
  ROUTE,
  METHOD,
  PATH,
  STATUS,
  BYTES_IN,
  BYTES_OUT,
  DURATION,
  TTFB,
  QUEUED,
  ERROR,
  AUTH_FAILURE,
  CREDENTIAL,
  REFUSED_BY,
  ABORTED,
];
const NULL = ascii('null');
const TRUE = ascii('true');
const FALSE = ascii('false');
const END = ascii(',"msg":"request completed"}\n');
/** Every constant byte of a line, and room for its seven numbers and its time. */
const FIXED = LEVEL_OPEN.length + KEYS.reduce((n, k) => n + k.length, 0) + FALSE.length + END.length + 8 * 24 + TIME.length;

/**
 * The most bytes the line for these fields can take: six bytes for each
 * UTF-16 unit of text (`\u001f`), three for each of the bindings (already
 * JSON), room for every number. Checked before writing, so a line is never
 * cut at the buffer's end.
 */
export function lineBound(time: string | null, bindings: string, f: RequestFields): number {
  let text = f.reqId.length + f.method.length + f.path.length + (f.traceId?.length ?? 4);
  text += (f.client?.length ?? 4) + (f.keyId?.length ?? 4) + (f.keyName?.length ?? 4) + (f.route?.length ?? 4);
  text += (f.error?.length ?? 4) + (f.authFailure?.length ?? 4) + (f.refusedBy?.length ?? 4);
  return FIXED + 6 * text + 3 * (bindings.length + (time?.length ?? 0)) + 2 * 8;
}

/**
 * Writes the line at `at` and returns where it ends. `time` is pino's time
 * piece (`,"time":…`), or null for the epoch time in ms, written here as
 * digits without a string. The caller has made room (lineBound).
 */
export function writeLine(buf: Buffer, at: number, level: number, time: string | null, bindings: string, f: RequestFields): number {
  at = put(buf, at, LEVEL_OPEN);
  at = uint(buf, at, level);
  if (time === null) {
    at = put(buf, at, TIME);
    at = uint(buf, at, Date.now());
  } else {
    at = raw(buf, at, time);
  }
  at = raw(buf, at, bindings);
  at = text(buf, put(buf, at, REQ_ID), f.reqId);
  at = text(buf, put(buf, at, TRACE_ID), f.traceId);
  at = text(buf, put(buf, at, CLIENT), f.client);
  at = text(buf, put(buf, at, KEY_ID), f.keyId);
  at = text(buf, put(buf, at, KEY_NAME), f.keyName);
  at = text(buf, put(buf, at, ROUTE), f.route);
  at = text(buf, put(buf, at, METHOD), f.method);
  at = text(buf, put(buf, at, PATH), f.path);
  at = num(buf, put(buf, at, STATUS), f.status);
  at = num(buf, put(buf, at, BYTES_IN), f.bytesIn);
  at = num(buf, put(buf, at, BYTES_OUT), f.bytesOut);
  at = num(buf, put(buf, at, DURATION), f.durationMs);
  at = num(buf, put(buf, at, TTFB), f.ttfbMs);
  at = num(buf, put(buf, at, QUEUED), f.queuedMs);
  at = text(buf, put(buf, at, ERROR), f.error);
  at = text(buf, put(buf, at, AUTH_FAILURE), f.authFailure);
  at = num(buf, put(buf, at, CREDENTIAL), f.credential);
  at = text(buf, put(buf, at, REFUSED_BY), f.refusedBy);
  at = put(buf, put(buf, at, ABORTED), f.aborted ? TRUE : FALSE);
  return put(buf, at, END);
}

function put(buf: Buffer, at: number, bytes: Uint8Array): number {
  for (let i = 0; i < bytes.length; i++) buf[at + i] = bytes[i] as number;
  return at + bytes.length;
}

/** A piece that is JSON already (pino's bindings and time): ASCII byte by byte, else encoded. */
function raw(buf: Buffer, at: number, s: string): number {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0x80) return at + buf.write(s, at, 'utf8');
    buf[at + i] = c;
  }
  return at + s.length;
}

/**
 * `JSON.stringify(s)` as bytes. Printable ASCII other than `"` and `\` is
 * copied as it is; a string with anything else is handed to JSON.stringify
 * whole (escapes, non-ASCII and lone surrogates spelled as it spells them).
 */
function text(buf: Buffer, at: number, s: string | null): number {
  if (s === null) return put(buf, at, NULL);
  buf[at] = 0x22;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x20 || c >= 0x80 || c === 0x22 || c === 0x5c) {
      return at + buf.write(JSON.stringify(s), at, 'utf8');
    }
    buf[at + 1 + i] = c;
  }
  buf[at + 1 + s.length] = 0x22;
  return at + 2 + s.length;
}

/** A number as the template literal writes it: non-negative safe integers digit by digit, the rest as String(n) does. */
function num(buf: Buffer, at: number, n: number | null): number {
  if (n === null) return put(buf, at, NULL);
  if (Number.isSafeInteger(n) && n >= 0) return uint(buf, at, n);
  // A value rounded to thousandths (durations) is written as its whole part
  // and up to three decimals, which is the shortest spelling that reads back
  // as the same double, as String(n) gives, while n stays far below 2^53 / 1000.
  const k = Math.round(n * 1000);
  if (n > 0 && n < 1e9 && k / 1000 === n) {
    const whole = Math.floor(k / 1000);
    let frac = k - whole * 1000;
    at = uint(buf, at, whole);
    if (frac === 0) return at;
    buf[at++] = 0x2e;
    let digits = 3;
    while (frac % 10 === 0) {
      frac /= 10;
      digits--;
    }
    for (let d = digits - 1; d >= 0; d--) {
      buf[at + d] = 0x30 + (frac % 10);
      frac = Math.floor(frac / 10);
    }
    return at + digits;
  }
  return raw(buf, at, String(n));
}

/** A non-negative safe integer's decimal digits. */
function uint(buf: Buffer, at: number, n: number): number {
  let digits = 1;
  for (let p = 10; p <= n; p *= 10) digits++;
  for (let d = digits - 1; d >= 0; d--) {
    const q = Math.floor(n / 10);
    buf[at + d] = 0x30 + (n - q * 10);
    n = q;
  }
  return at + digits;
}
