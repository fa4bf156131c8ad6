// Header rules for both directions. Pure.
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import { containsTokenLike } from '../keys/token.ts';
import type { Route } from './routes.ts';

// RFC 9110 §7.6.1: meaningful for one connection only, never forwarded.
// Proxy-Authorization is the client's credential for *us*; Trailer is dropped
// because trailers are not relayed.
const HOP_BY_HOP: ReadonlySet<string> = new Set([
  'connection',
  'keep-alive',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

// Request headers that never go upstream, whatever the route:
// - authorization: the client's own token (the upstream credential is set anew);
// - expect: the gateway answers `100-continue` itself once the request passed
//   its checks, so the upstream has nothing left to confirm;
// - host: set to the upstream's by the forwarder.
const ALWAYS_STRIPPED: readonly string[] = ['authorization', 'expect', 'host'];

/** Method-override headers that upstream frameworks honour (RFC-less convention, e.g. Google, Rails, Express). */
export const METHOD_OVERRIDE_HEADERS: readonly string[] = ['x-http-method-override', 'x-http-method', 'x-method-override'];

/**
 * A header name in the one form the gateway compares: lower case (Node
 * already gives it so) with `_` read as `-`. CGI, Rack and some Java servers
 * map both to the same variable (`HTTP_X_HTTP_METHOD_OVERRIDE`), so
 * `X_HTTP_Method_Override` or `xi_api_key` is the real header to them; nginx
 * drops underscore names by default for this reason. Names without `_` (all
 * but a rare few) are returned as they are, at no cost.
 */
function headerKey(name: string): string {
  return name.indexOf('_') < 0 ? name : name.replaceAll('_', '-');
}

const OVERRIDES: ReadonlySet<string> = new Set(METHOD_OVERRIDE_HEADERS);

/** True when the headers carry a method override in any spelling. */
export function hasMethodOverride(headers: IncomingHttpHeaders): boolean {
  for (const name in headers) if (OVERRIDES.has(headerKey(name))) return true;
  return false;
}

export function requestStripSet(extra: readonly string[], credentialHeader: string | null): ReadonlySet<string> {
  const names = new Set<string>([...ALWAYS_STRIPPED, ...extra.map((h) => h.toLowerCase())]);
  if (credentialHeader !== null) names.add(credentialHeader.toLowerCase());
  return names;
}

/** Header names listed in a Connection header value (RFC 9110 §7.6.1), lower-cased. */
function connectionNamed(value: string | string[] | undefined): Set<string> | null {
  if (value === undefined) return null;
  // The common values name no header: nothing to split.
  if (typeof value === 'string' && (value.length === 10 || value.length === 5)) {
    const v = value.toLowerCase();
    if (v === 'keep-alive' || v === 'close') return null;
  }
  const text = Array.isArray(value) ? value.join(',') : value;
  let named: Set<string> | null = null;
  for (const part of text.split(',')) {
    const name = headerKey(part.trim().toLowerCase());
    if (name.length > 0 && name !== 'close' && name !== 'keep-alive') (named ??= new Set()).add(name);
  }
  return named;
}

function carriesToken(value: string | string[]): boolean {
  if (typeof value === 'string') return containsTokenLike(value);
  for (const v of value) if (containsTokenLike(v)) return true;
  return false;
}

/**
 * The headers sent upstream: the client's, minus hop-by-hop ones, minus any
 * header whose name or value carries something shaped like a client token
 * (in any case or percent-encoding: the client's own token, or another of
 * its keys, in a cookie or an X-Api-Key), plus the route's credential.
 *
 * Framing is re-derived from what Node's parser accepted, after the
 * Connection-named removal: a client cannot make the gateway drop its own
 * Content-Length by listing it in Connection and so have the body reach the
 * upstream unframed (request smuggling, cf. GHSA-ggv3-7p47-pfv8).
 */
export function upstreamRequestHeaders(incoming: IncomingHttpHeaders, route: Route, credential: readonly [string, string]): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  const named = connectionNamed(incoming.connection);
  const strip = route.stripHeaders;
  for (const name in incoming) {
    const key = headerKey(name);
    if (HOP_BY_HOP.has(key) || strip.has(key) || (named !== null && named.has(key))) continue;
    // `content_length` beside the real Content-Length is a second length to an upstream that folds `_`.
    if (key !== name && key === 'content-length') continue;
    const value = incoming[name];
    if (value === undefined || carriesToken(value) || containsTokenLike(name)) continue;
    out[name] = value;
  }
  if (incoming['transfer-encoding'] !== undefined) {
    out['transfer-encoding'] = 'chunked';
    delete out['content-length'];
  } else if (incoming['content-length'] !== undefined) {
    out['content-length'] = incoming['content-length'];
  }
  out[credential[0]] = credential[1];
  return out;
}

/** Upstream response headers as a flat raw list minus hop-by-hop ones; case and repeats (set-cookie) kept. */
export function downstreamResponseHeaders(raw: readonly string[]): string[] {
  let named: Set<string> | null = null;
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i] as string;
    if (name.length === 10 && name.toLowerCase() === 'connection') {
      const more = connectionNamed(raw[i + 1]);
      if (more !== null) for (const n of more) (named ??= new Set()).add(n);
    }
  }
  const out: string[] = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i] as string;
    const lower = name.toLowerCase();
    if (HOP_BY_HOP.has(lower) || (named !== null && named.has(lower))) continue;
    out.push(name, raw[i + 1] as string);
  }
  return out;
}
