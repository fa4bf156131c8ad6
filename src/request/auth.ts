// Where the client token comes from (docs/authentication.md). Pure.
// `Authorization: Bearer` always; on routes listed in KEYWARD_NATIVE_AUTH
// also the place that provider's SDK puts its key, so the SDK works with only
// its base URL changed. Whichever place it came from, the pipeline removes it
// and injects the upstream credential exactly as for a Bearer token: every
// native place is also a header or parameter the route strips.
import type { IncomingHttpHeaders } from 'node:http';
import { paramValue } from './query.ts';
import { routeByPrefix, type NativeCredential, type RouteTable } from './routes.ts';

export function presentedToken(headers: IncomingHttpHeaders, url: string, table: RouteTable): string | null {
  const bearer = bearerToken(headers.authorization);
  if (bearer !== null) return bearer;
  const route = routeByPrefix(table, url);
  if (route === undefined && url.startsWith('/keyward/')) {
    // The gateway's own paths: a key holder whose SDK puts the token in a native place may ask there too.
    for (const r of table.values()) {
      const t = r.native === null ? null : nativeToken(r.native, headers, url);
      if (t !== null) return t;
    }
    return null;
  }
  const native = route?.native;
  if (native === undefined || native === null) return null;
  return nativeToken(native, headers, url);
}

function nativeToken(native: NativeCredential, headers: IncomingHttpHeaders, url: string): string | null {
  switch (native.kind) {
    case 'header': {
      const value = headers[native.name];
      return typeof value === 'string' && value.length > 0 ? value.trim() : null;
    }
    case 'basic':
      return basicPassword(headers.authorization);
    case 'query': {
      const q = url.indexOf('?');
      return q < 0 ? null : paramValue(url.slice(q + 1), native.name);
    }
  }
}

/** The token from an `Authorization: Bearer <token>` value (scheme case-insensitive, RFC 9110 §11.1), or null. */
export function bearerToken(header: string | undefined): string | null {
  if (header === undefined || header.length < 8) return null;
  const space = header.indexOf(' ');
  if (space !== 6 || header.slice(0, 6).toLowerCase() !== 'bearer') return null;
  let start = 7;
  while (header.charCodeAt(start) === 32) start++;
  const token = header.slice(start);
  return token.length > 0 && token.indexOf(' ') < 0 ? token : null;
}

/** The password of an `Authorization: Basic base64(login:password)` value (RFC 7617), or null. */
export function basicPassword(header: string | undefined): string | null {
  if (header === undefined || header.length < 7) return null;
  if (header.charCodeAt(5) !== 32 || header.slice(0, 5).toLowerCase() !== 'basic') return null;
  const decoded = Buffer.from(header.slice(6).trim(), 'base64').toString('utf8');
  const colon = decoded.indexOf(':');
  return colon < 0 ? null : decoded.slice(colon + 1);
}
