// The gateway's own answers. Every error a client can receive from keyward is
// one row here: a stable `code` (the contract, docs/responses.md) plus a fixed message.
// Bodies are serialised once at load time, so replying costs one write.
import { STATUS_CODES } from 'node:http';
import type { LimitDetail } from '../limits/limiter.ts';
import { micro } from '../lib/format.ts';

export type ErrorCode =
  | 'bad_request'
  | 'unauthorized'
  | 'forbidden'
  | 'budget_unenforceable'
  | 'not_found'
  | 'request_timeout'
  | 'payload_too_large'
  | 'rate_limited'
  | 'concurrency_limited'
  | 'quota_exceeded'
  | 'budget_exceeded'
  | 'expectation_failed'
  | 'headers_too_large'
  | 'upstream_unreachable'
  | 'route_not_configured'
  | 'upstream_credentials_exhausted'
  | 'upstream_busy'
  | 'shutting_down'
  | 'keystore_unavailable'
  | 'key_unsupported'
  | 'ledger_unavailable'
  | 'admission_unavailable'
  | 'upstream_timeout';

interface Entry {
  readonly status: number;
  readonly code: ErrorCode;
  readonly message: string;
}

const entries = {
  malformed: { status: 400, code: 'bad_request', message: 'Malformed request.' },
  tokenInUrl: { status: 400, code: 'bad_request', message: 'A client token must not appear in the URL.' },
  credentialLookalike: { status: 400, code: 'bad_request', message: 'A query parameter an upstream could read as its credential is not allowed.' },
  badPathEscape: { status: 400, code: 'bad_request', message: 'The path holds an encoded control character, a %u escape or overlong UTF-8.' },
  unauthorized: { status: 401, code: 'unauthorized', message: 'Unauthorized.' },
  forbidden: { status: 403, code: 'forbidden', message: 'This key may not use this route.' },
  // docs/keys.md, "Allowed addresses": nothing forwarded, nothing counted against the key's limits.
  notFromHere: { status: 403, code: 'forbidden', message: 'This key is not allowed from this address.' },
  // docs/limits.md, "Scraper runs": spend the gateway would never see cannot be held to a budget.
  budgetUnenforceable: {
    status: 403,
    code: 'budget_unenforceable',
    message:
      "This key has a budget on this route, and this call would make the platform spend later, out of the gateway's sight (schedules, webhooks, builds).",
  },
  noRoute: { status: 404, code: 'not_found', message: 'No route for this path.' },
  // 404, as for an unknown path (docs/routes.md): the route carries no such method.
  methodNotOnRoute: { status: 404, code: 'not_found', message: 'Method not allowed on this route.' },
  methodOverride: { status: 404, code: 'not_found', message: 'Method overrides are not allowed.' },
  dotSegment: { status: 404, code: 'not_found', message: 'Paths with dot-segments are not allowed.' },
  webSocket: { status: 404, code: 'not_found', message: 'WebSocket upgrades are not proxied.' },
  requestTimeout: { status: 408, code: 'request_timeout', message: 'The request body stalled.' },
  payloadTooLarge: { status: 413, code: 'payload_too_large', message: 'Request body exceeds the configured limit.' },
  // RFC 9110 §10.1.1: 100-continue is the only expectation defined; anything else may be refused with 417.
  expectationFailed: { status: 417, code: 'expectation_failed', message: 'Only Expect: 100-continue is supported.' },
  // A key's limits (docs/limits.md); sent with Retry-After and RateLimit-* headers.
  rateLimited: { status: 429, code: 'rate_limited', message: "This key's rate limit is reached." },
  concurrencyLimited: { status: 429, code: 'concurrency_limited', message: 'This key has as many requests in flight as it may.' },
  quotaExceeded: { status: 429, code: 'quota_exceeded', message: "This key's request quota for the period is spent." },
  budgetExceeded: { status: 429, code: 'budget_exceeded', message: "This key's budget on this route for the period is spent." },
  headersTooLarge: { status: 431, code: 'headers_too_large', message: 'Request headers exceed the configured limit.' },
  upstreamUnreachable: { status: 502, code: 'upstream_unreachable', message: 'Upstream unreachable.' },
  // Both counted as the upstream failing (upstream_unreachable, the code
  // clients and dashboards already treat as such): what it sent cannot be
  // relayed safely. The log line's `error` says which (docs/security.md).
  unscannableResponse: { status: 502, code: 'upstream_unreachable', message: 'The upstream answered in a content coding the gateway cannot inspect.' },
  secretInCompressedBody: { status: 502, code: 'upstream_unreachable', message: 'The upstream answered with a compressed body the gateway would not relay.' },
  routeNotConfigured: { status: 503, code: 'route_not_configured', message: 'This route has no upstream credential configured.' },
  // docs/credentials.md, "None available": every credential of the route is set aside; nothing forwarded, nothing counted.
  credentialsExhausted: {
    status: 503,
    code: 'upstream_credentials_exhausted',
    message: 'Every upstream credential of this route is set aside for now; nothing was forwarded.',
  },
  // docs/credentials.md, "Capacity": no account had room within KEYWARD_QUEUE_WAIT, or the queue is full; nothing forwarded, nothing counted.
  upstreamBusy: { status: 503, code: 'upstream_busy', message: "The upstream's capacity is in use; retry after the stated time." },
  shuttingDown: { status: 503, code: 'shutting_down', message: 'The gateway is shutting down.' },
  keystoreUnavailable: { status: 503, code: 'keystore_unavailable', message: 'No key set is available.' },
  // docs/keys.md, "Versions": a key is never served without the rules it was given.
  keyUnsupported: {
    status: 503,
    code: 'key_unsupported',
    message: 'This key has rules this gateway cannot enforce (it was written by a newer keyward); nothing was forwarded.',
  },
  // docs/limits.md, "Limits under faults": a quota or budget is never decided without the ledger.
  ledgerUnavailable: { status: 503, code: 'ledger_unavailable', message: "The usage ledger cannot be read; this key's quota or budget cannot be checked." },
  // docs/limits.md, "One key, one limit": the process that decides limits did not answer in time.
  admissionUnavailable: { status: 503, code: 'admission_unavailable', message: "This key's limits could not be checked in time; nothing was forwarded." },
  upstreamTimeout: { status: 504, code: 'upstream_timeout', message: 'Upstream did not answer in time.' },
} as const satisfies Record<string, Entry>;

export type ErrorName = keyof typeof entries;

export interface GatewayError extends Entry {
  readonly name: ErrorName;
  /** The status line's reason phrase. */
  readonly reason: string;
  readonly body: Buffer;
}

export const ERRORS: { readonly [K in ErrorName]: GatewayError } = Object.freeze(
  Object.fromEntries(
    Object.entries(entries).map(([name, e]) => [
      name,
      Object.freeze({ ...e, name, reason: STATUS_CODES[e.status] ?? '', body: Buffer.from(JSON.stringify({ error: e.message, code: e.code })) }),
    ]),
  ) as { [K in ErrorName]: GatewayError },
);

/** A number as a person reads it: no float dust (0.1 + 0.2), no exponent. */
const plain = (n: number): string => String(micro(n));

/**
 * A 429 from a key's limits that explains itself (docs/limits.md,
 * "Refusals"): the catalogue's code, a sentence naming the limit, its value
 * and when it resets, and the same as fields under `limit`, `unit` being
 * the route's for a budget (`usd`, `characters`) and `requests` otherwise.
 * The only answer built per request: its numbers are the request's own.
 */
export function limitRefusal(base: GatewayError, d: LimitDetail, budgetUnit: string): GatewayError {
  const unit = d.kind === 'budget' ? budgetUnit : 'requests';
  const per = d.period === null ? '' : ` per ${d.period}`;
  const message =
    d.kind === 'quota'
      ? `Quota of ${plain(d.value)} requests${per} used up; it resets at ${d.resetsAt}.`
      : d.kind === 'budget'
        ? `Budget of ${plain(d.value)} ${unit}${per} on ${d.route} used up (${plain(d.used)} spent or reserved); it resets at ${d.resetsAt}.`
        : d.kind === 'rate'
          ? `Rate limit of ${plain(d.value)} requests per ${d.window} s reached; the next request is allowed at ${d.resetsAt}.`
          : `Concurrency limit of ${plain(d.value)} requests in flight reached; one may start when another finishes.`;
  const limit = {
    kind: d.kind,
    ...(d.route === null ? {} : { route: d.route }),
    value: d.value,
    unit,
    used: d.used,
    period: d.period,
    ...(d.window === null ? {} : { window: d.window }),
    resetsAt: d.resetsAt,
  };
  return { ...base, message, body: Buffer.from(JSON.stringify({ error: message, code: base.code, limit })) };
}

/**
 * Upstream failures, translated in one place: first what an upstream
 * connection's error stands for, then what the client is answered for each
 * way an upstream can fail. The gateway owns its timers and marks the error
 * it raises, so a timeout is never confused with a reset:
 * `ECONNECT_TIMEOUT` comes from http-proxy-3's connect timer,
 * `KEYWARD_UPSTREAM_TIMEOUT` from ours. Everything else before the response
 * began (refused, reset, DNS, TLS) is "unreachable".
 */
export function upstreamReason(code: string | undefined): 'timeout' | 'unreachable' {
  switch (code) {
    case 'ECONNECT_TIMEOUT':
    case 'ETIMEDOUT':
    case 'KEYWARD_UPSTREAM_TIMEOUT':
      return 'timeout';
    default:
      return 'unreachable';
  }
}

/** The upstream did not give a whole answer. */
export type UpstreamReason =
  /** Refused, reset, DNS or TLS failure before the response began; `detail` is the system's code (ECONNREFUSED, CERT_HAS_EXPIRED…). */
  | 'unreachable'
  /** No connection, or no response head, in time; `detail` says which timer. */
  | 'timeout'
  /** The response began and the upstream stopped sending. */
  | 'aborted'
  /** The response body stalled for KEYWARD_IDLE_TIMEOUT. */
  | 'idle'
  | 'unexpected_101'
  /** A status line or header Node refuses to write. */
  | 'invalid_response'
  /** A content coding the egress filter cannot read. */
  | 'unscannable_encoding'
  /** A compressed body that held an upstream secret: cut. */
  | 'secret_in_compressed_body';

/**
 * The answer to each upstream failure while nothing of the response went
 * yet (after that, the client's connection is closed: the only signal left).
 * A body the gateway cannot inspect is a 502 that says so.
 */
export const UPSTREAM_ANSWERS: Readonly<Record<UpstreamReason, GatewayError>> = {
  unreachable: ERRORS.upstreamUnreachable,
  timeout: ERRORS.upstreamTimeout,
  aborted: ERRORS.upstreamUnreachable,
  idle: ERRORS.upstreamTimeout,
  unexpected_101: ERRORS.upstreamUnreachable,
  invalid_response: ERRORS.upstreamUnreachable,
  unscannable_encoding: ERRORS.unscannableResponse,
  secret_in_compressed_body: ERRORS.secretInCompressedBody,
};

/**
 * A request Node's parser refused before the gateway saw it (`clientError`):
 * the answer, or null when nobody is left to answer (the client closed its
 * side mid-request, or a socket error that is not a parse error).
 */
export function parseFailure(code: string | undefined): GatewayError | null {
  if (code === 'HPE_HEADER_OVERFLOW') return ERRORS.headersTooLarge;
  if (code === 'ERR_HTTP_REQUEST_TIMEOUT') return ERRORS.requestTimeout;
  if (code === 'HPE_INVALID_EOF_STATE') return null;
  return code?.startsWith('HPE_') === true ? ERRORS.malformed : null;
}
