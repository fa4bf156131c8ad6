// The pipeline's guards (docs/routes.md, authentication.md, responses.md): an ordered list of small pure
// checks run after authentication and routing, before anything is
// forwarded. The first one that objects answers the request.
import type { IncomingHttpHeaders } from 'node:http';
import { ERRORS, type GatewayError } from './errors.ts';
import { hasMethodOverride } from './headers.ts';
import { inScope, type Principal } from '../keys/keyset.ts';
import { containsTokenLike } from '../keys/token.ts';
import { hasLookalike, hasParam } from './query.ts';
import type { Route } from './routes.ts';

export interface GuardInput {
  readonly headers: IncomingHttpHeaders;
  readonly route: Route;
  readonly principal: Principal;
  /** The path after the route prefix, as it will be forwarded. */
  readonly path: string;
  /** The raw query as the client sent it, or null. */
  readonly query: string | null;
  /** The query as it will be forwarded (credential parameters removed). */
  readonly forwardQuery: string;
  readonly maxBodyBytes: number;
}

export type Guard = (g: GuardInput) => GatewayError | null;

/**
 * Nothing shaped like a client token may travel upstream in the URL: the
 * caller's own (percent-encoded, lower-cased) or another of its keys. The
 * credential parameters were removed before this check, so
 * `?token=<own token>` on the scraper route is simply dropped (docs/routes.md).
 */
const tokenInUrl: Guard = (g) => (containsTokenLike(g.path) || containsTokenLike(g.forwardQuery) ? ERRORS.tokenInUrl : null);

/**
 * What is left of the query after the credential parameters were removed
 * holds none that a lenient upstream parser could still read as one
 * (`token%00=`, `;token=`): refused, since rewriting it would change what
 * other parsers read (docs/routes.md).
 */
const credentialLookalike: Guard = (g) => (hasLookalike(g.forwardQuery, g.route.dropQuery) ? ERRORS.credentialLookalike : null);

/** Method overrides would side-step the route's method list (docs/routes.md): refused, not stripped. */
const methodOverride: Guard = (g) => {
  if (g.query !== null && (hasParam(g.query, g.route.overrideQuery) || hasLookalike(g.query, g.route.overrideQuery))) return ERRORS.methodOverride;
  return hasMethodOverride(g.headers) ? ERRORS.methodOverride : null;
};

const scope: Guard = (g) => (inScope(g.principal, g.route.name) ? null : ERRORS.forbidden);

const routeConfigured: Guard = (g) => (g.route.credential === null ? ERRORS.routeNotConfigured : null);

/**
 * Node's parser already refused CL+TE and a TE whose last coding is not
 * chunked; anything but a plain `chunked` (e.g. `gzip, chunked`) would reach
 * the upstream re-framed and mislabelled (RFC 9112 §6.1), so refuse it.
 */
const framing: Guard = (g) => {
  const te = g.headers['transfer-encoding'];
  return te !== undefined && te.toLowerCase() !== 'chunked' ? ERRORS.malformed : null;
};

/** Declared bodies over the limit are refused before a byte is forwarded; chunked ones are counted as they pass. */
const size: Guard = (g) => {
  const cl = g.headers['content-length'];
  return cl !== undefined && Number(cl) > g.maxBodyBytes ? ERRORS.payloadTooLarge : null;
};

export const GUARDS: readonly Guard[] = [tokenInUrl, credentialLookalike, methodOverride, scope, routeConfigured, framing, size];

export function runGuards(g: GuardInput): GatewayError | null {
  for (const guard of GUARDS) {
    const err = guard(g);
    if (err !== null) return err;
  }
  return null;
}
