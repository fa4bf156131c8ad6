// The one completion point of every request (docs/logs.md, operations.md): exactly one
// "request completed" log line and the metrics, fed from the same fields.
import type { Exchange } from './exchange.ts';
import { redactTokens } from '../keys/token.ts';
import { requestLogger, type Logger } from '../observe/log.ts';
import type { Metrics } from '../observe/metrics.ts';
import { failureLabel, neverConnected } from './outcome.ts';
import type { Ledger } from '../ledger/ledger.ts';
import { dropParams } from './query.ts';
import { traceIdOf } from '../observe/trace.ts';

export type Complete = (ex: Exchange, status: number | null, aborted: boolean) => void;

/**
 * Longest path written to a log line, in characters. A client chooses its
 * path: uncut, a line is as long as the path, and an unauthenticated flood
 * becomes a flood of log. Cut, with the original length kept in the text, a
 * line stays a few hundred bytes.
 */
const LOG_PATH_MAX = 200;

/** `path`, or its first LOG_PATH_MAX characters and its length: `/seo/aaaa…[16384 chars]`. */
function boundedPath(path: string): string {
  return path.length <= LOG_PATH_MAX ? path : `${path.slice(0, LOG_PATH_MAX)}…[${path.length} chars]`;
}

/** `credentialParams`: every route's credential query names, scrubbed from paths that matched no route. */
export function createCompletion(logger: Logger, metrics: Metrics, credentialParams: () => ReadonlySet<string>, ledger: Ledger | null = null): Complete {
  // A cost that is not a number is said once per route, not once per request.
  const badCost = new Set<string>();
  const line = requestLogger(logger);
  function logPathOf(ex: Exchange): string {
    if (ex.logPath !== null) return boundedPath(ex.logPath);
    const q = ex.url.indexOf('?');
    if (q < 0) return boundedPath(redactTokens(ex.url));
    const query = dropParams(ex.url.slice(q + 1), credentialParams());
    // Redacted before it is cut: a cut must not leave half a token unrecognised.
    return boundedPath(redactTokens(query === '' ? ex.url.slice(0, q) : `${ex.url.slice(0, q)}?${query}`));
  }

  return (ex, status, aborted) => {
    const req = ex.req;
    const durationMs = performance.now() - ex.start;
    const bytesIn = ex.bytesIn >= 0 ? ex.bytesIn : req.complete ? Number(req.headers['content-length'] ?? 0) : null;
    const fields = {
      reqId: ex.id,
      traceId: traceIdOf(req.headers.traceparent),
      client: ex.client,
      keyId: ex.principal?.id ?? null,
      keyName: ex.principal?.name ?? null,
      route: ex.route?.name ?? null,
      method: req.method as string,
      path: logPathOf(ex),
      status,
      bytesIn,
      bytesOut: ex.bytesOut,
      durationMs: Math.round(durationMs * 1000) / 1000,
      ttfbMs: ex.ttfbMs >= 0 ? Math.round(ex.ttfbMs * 1000) / 1000 : null,
      queuedMs: ex.queuedMs >= 0 ? Math.round(ex.queuedMs * 1000) / 1000 : null,
      error: failureLabel(ex.failure),
      // On a route with several: the credential that answered (its number), and those refused before it.
      credential: ex.route !== null && ex.route.credentials.length > 1 ? (ex.credential?.label ?? null) : null,
      refusedBy: ex.refusedBy === null ? null : ex.refusedBy.join(','),
      authFailure: ex.authFailure,
      aborted,
    };
    line(ex.upstreamFailed ? 'warn' : status !== null && status >= 500 ? 'error' : 'info', fields);

    const route = ex.route?.index ?? metrics.noRoute;
    if (ex.masked !== null) {
      // Which secret by route and form; never its value.
      const secrets = [...new Set(ex.masked.map((f) => `${f.route} ${f.form}`))];
      logger.warn(
        { reqId: ex.id, route: fields.route, path: fields.path, secrets, cut: fields.error === 'secret_in_compressed_body' },
        'upstream secret found in a response and kept from the client',
      );
      for (const s of secrets) metrics.egressMasked(route, s);
    }
    if (ex.forwardStart > 0) metrics.inFlight(route, -1);
    if (ex.upstreamFailed) metrics.upstreamError(route, fields.error ?? 'error');
    const key = ex.principal;
    // A request whose connection to the upstream was never made was not forwarded: not counted (docs/limits.md).
    if (ledger !== null && ex.forwardStart > 0 && key !== null && ex.route !== null && !neverConnected(ex.failure)) {
      // The upstream's own status only: one the gateway answered for it counts as `other`.
      const run = ex.runPath === null && !ex.syncRun ? null : runBooking(ex, status);
      const upstreamStatus = ex.ttfbMs >= 0 && !ex.takenOver ? status : null;
      ledger.record(key.id, ex.route.name, upstreamStatus, bytesIn ?? 0, ex.bytesOut, ex.cost, undefined, run);
      if (ex.credential !== null && ex.route.credentials.length > 1) credentialAnswers(ledger, ex, upstreamStatus);
      if (ex.costBad && !badCost.has(ex.route.name)) {
        badCost.add(ex.route.name);
        logger.warn({ route: ex.route.name }, 'the upstream reported a cost that is not a number; counted as no cost (said once per route)');
      }
    }
    metrics.request(route, req.method as string, status ?? 0, durationMs / 1000, ex.ttfbMs / 1000, bytesIn ?? 0, ex.bytesOut);
  };
}

/** Each credential's answers to one request (docs/credentials.md, "Seen"): those that refused it, and the one that answered. */
function credentialAnswers(ledger: Ledger, ex: Exchange, status: number | null): void {
  const route = (ex.route as NonNullable<Exchange['route']>).name;
  for (const r of ex.refusedBy ?? []) {
    const colon = r.indexOf(':');
    ledger.credentialAnswer(route, Number(r.slice(0, colon)), Number(r.slice(colon + 1)), 0);
  }
  ledger.credentialAnswer(route, (ex.credential as NonNullable<Exchange['credential']>).label, status, ex.cost);
}

/**
 * A scraper run-start that reached the upstream (docs/limits.md, "Scraper
 * runs"): what is booked now, set as the call's cost (its admission is
 * reconciled at it), and the run to settle later. A run its answer named is booked at
 * its reservation and settled later; a start whose answer was an error
 * started nothing; one whose answer the gateway did not see whole (the
 * client left) may have started a run it cannot name: its reservation stays
 * booked, never settled, as does a synchronous run's (its answer names no
 * run).
 */
function runBooking(ex: Exchange, status: number | null): { id: string; path: string; credential: number } | null {
  const reserved = ex.admission?.reserved ?? 0;
  const run = ex.run;
  // What is booked now is what the limits are reconciled at: a reported cost, though nobody reported it.
  if (run === null) {
    const refused = status !== null && status >= 300 && !ex.takenOver && ex.proxyRes?.complete === true;
    ex.costIs(refused ? 0 : reserved, ex.costBad, true);
    return null;
  }
  ex.costIs(reserved, ex.costBad, true);
  return { id: run.id, path: `${ex.runPath ?? ''}/actor-runs/${run.id}`, credential: ex.credential?.label ?? 1 };
}
