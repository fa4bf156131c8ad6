// How a request ended, when not as the upstream's whole answer: a closed set
// of reasons, recorded once per request (the first one wins: a later
// consequence of the same failure, such as the reset after our own timeout,
// never overwrites its cause). The log line's `error` field and the
// `keyward_upstream_errors_total{reason}` label are both read from here.
import type { ErrorCode, UpstreamReason } from './errors.ts';

export type Failure =
  /** The gateway answered with a catalogue error (a refusal, or the answer to an upstream failure below). */
  | { readonly by: 'gateway'; readonly code: ErrorCode }
  | { readonly by: 'upstream'; readonly reason: UpstreamReason; readonly detail: string | null }
  /** The client stopped reading for KEYWARD_IDLE_TIMEOUT, or sent the request behind one this connection refused. */
  | { readonly by: 'client'; readonly reason: 'idle' | 'connection_closing' };

/** Names as they appear in logs and metrics, where they differ from the reason itself. */
const UPSTREAM_LABELS: Readonly<Record<UpstreamReason, string>> = {
  unreachable: 'upstream_unreachable',
  timeout: 'upstream_timeout',
  aborted: 'upstream_aborted',
  idle: 'upstream_idle',
  unexpected_101: 'unexpected_101',
  invalid_response: 'invalid_upstream_response',
  unscannable_encoding: 'unscannable_encoding',
  secret_in_compressed_body: 'secret_in_compressed_body',
};

/** The `error` field of the log line: the system's code when there is one, else the reason's name. */
export function failureLabel(f: Failure | null): string | null {
  if (f === null) return null;
  if (f.by === 'gateway') return f.code;
  if (f.by === 'client') return f.reason === 'idle' ? 'client_idle' : 'connection_closing';
  return f.detail ?? UPSTREAM_LABELS[f.reason];
}

/**
 * System codes of a connection to the upstream that was never made: refused,
 * no route, no such host, the connect timer, or a TLS handshake that failed
 * before the request was written. A request that failed so never reached the
 * upstream (nothing was billed), and gives back what its admission took.
 */
const NEVER_CONNECTED = new Set(['ECONNREFUSED', 'ENOTFOUND', 'EAI_AGAIN', 'EAI_FAIL', 'EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL', 'ECONNECT_TIMEOUT']);
const TLS_FAILURE = /^(?:ERR_TLS_|ERR_SSL_|CERT_|UNABLE_TO_|DEPTH_ZERO_SELF_SIGNED_CERT$|SELF_SIGNED_CERT_IN_CHAIN$)/;

/** Whether `f` says the request never reached the upstream at all. */
export function neverConnected(f: Failure | null): boolean {
  return (
    f !== null &&
    f.by === 'upstream' &&
    (f.reason === 'unreachable' || f.reason === 'timeout') &&
    f.detail !== null &&
    (NEVER_CONNECTED.has(f.detail) || TLS_FAILURE.test(f.detail))
  );
}

/** An upstream failure. */
export function upstream(reason: UpstreamReason, detail: string | null = null): Failure {
  return { by: 'upstream', reason, detail };
}
