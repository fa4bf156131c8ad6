// Where the client token comes from (docs/authentication.md). Pure.
// `Authorization: Bearer` always; on routes listed in KEYWARD_NATIVE_AUTH
// also the place that provider's SDK puts its key, so the SDK works with only
// its base URL changed. Whichever place it came from, the pipeline removes it
// and injects the upstream credential exactly as for a Bearer token: every
// native place is also a header or parameter the route strips.
import type { IncomingHttpHeaders } from 'node:http';
import { basicPassword, bearerToken } from './keys/keyset.ts';
import { paramValue } from './query.ts';
import { routeByPrefix, type RouteTable } from './routes.ts';

export function presentedToken(headers: IncomingHttpHeaders, url: string, table: RouteTable): string | null {
  const bearer = bearerToken(headers.authorization);
  if (bearer !== null) return bearer;
  const native = routeByPrefix(table, url)?.native;
  if (native === undefined || native === null) return null;
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
