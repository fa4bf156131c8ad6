// The routes of a configuration (docs/routes.md): each provider of the
// table in routes.ts resolved against the options (its URL, its secrets,
// whether its SDK's own credential place is accepted).
import { METHOD_OVERRIDE_HEADERS, requestStripSet } from '../request/headers.ts';
import type { Credential, Route, UpstreamSpec } from '../request/routes.ts';
import type { Options, ReadFile } from './options.ts';
import { secret } from './secrets.ts';
import { routeCapacity } from './capacity.ts';

function upstreamUrl(o: Options, spec: UpstreamSpec): { target: URL; basePath: string } | null {
  // Set to nothing is a mistake, not a wish for the default: the gateway would forward to a provider nobody named.
  if (o.empty(spec.urlEnv)) {
    o.problem(`${spec.urlEnv} is set but empty; unset it to use ${spec.defaultUrl}`);
    return null;
  }
  const text = o.text(spec.urlEnv, spec.defaultUrl);
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    // `api.elevenlabs.io` or `localhost:8080`: a host without its scheme.
    const bare = /^[a-z0-9.-]+(?::\d+)?(?:\/|$)/i.test(text);
    o.problem(`${spec.urlEnv} is not a URL${bare ? ` (the scheme is missing: https://${text})` : ''}`);
    return null;
  }
  const wrong =
    url.protocol !== 'http:' && url.protocol !== 'https:'
      ? 'must be http:// or https://'
      : url.username !== '' || url.password !== ''
        ? 'must not carry credentials (use the secret options)'
        : url.search !== '' || url.hash !== ''
          ? 'must not have a query or fragment'
          : null;
  if (wrong !== null) {
    o.problem(`${spec.urlEnv} ${wrong}`);
    return null;
  }
  return { target: new URL(url.origin), basePath: url.pathname.replace(/\/+$/, '') };
}

/** The most credentials one route may hold (docs/credentials.md). */
export const MAX_CREDENTIALS = 32;

/** Credential `n`'s option for one of a provider's secrets: `KEYWARD_SPEECH_KEY` for 1, `KEYWARD_SPEECH_KEY_2` for 2. */
export function numberedEnv(name: string, n: number): string {
  return n === 1 ? name : `${name}_${n}`;
}

/**
 * A route's credentials, numbered from 1 without gaps (docs/credentials.md).
 * Each problem names the options, never a value: a gap, a login without its
 * password, the same credential twice.
 */
function credentials(o: Options, spec: UpstreamSpec, readFile: ReadFile): Credential[] {
  const found: Array<Credential & { readonly names: readonly string[] }> = [];
  let gap: number | null = null;
  for (let n = 1; n <= MAX_CREDENTIALS; n++) {
    const names = spec.secretEnvs.map((e) => numberedEnv(e, n));
    const values = names.map((name) => secret(o, name, readFile));
    const given = values.filter((s): s is string => s !== null);
    if (given.length === 0) {
      gap ??= n;
      continue;
    }
    if (given.length < values.length) {
      o.problem(`${names.filter((_, i) => values[i] === null).join(', ')} must be set along with ${names.filter((_, i) => values[i] !== null).join(', ')}`);
      continue;
    }
    if (gap !== null) {
      o.problem(`${names.join(', ')} is set but ${numberedEnv(spec.secretEnvs[0] as string, gap)} is not: credentials are numbered from 1 without gaps`);
      continue;
    }
    const header = spec.credential(given);
    const same = found.find((c) => c.header[1] === header[1]);
    if (same !== undefined) {
      o.problem(`${names.join(', ')} repeat ${same.names.join(', ')}: the same credential twice on route ${spec.name}`);
      continue;
    }
    found.push({ label: n, header, forms: spec.secretForms(given), names });
  }
  return found.map(({ label, header, forms }) => ({ label, header, forms }));
}

function route(o: Options, spec: UpstreamSpec, index: number, readFile: ReadFile, native: ReadonlySet<string>): Route | null {
  const where = upstreamUrl(o, spec);
  const creds = credentials(o, spec, readFile);
  if (where === null) return null;
  const credential = creds[0]?.header ?? null;
  return {
    name: spec.name,
    index,
    prefix: `/${spec.name}/`,
    methods: new Set(spec.methods),
    target: where.target,
    basePath: where.basePath,
    credential,
    credentials: creds,
    secretForms: creds.flatMap((c) => c.forms),
    native: native.has(spec.name) ? spec.native : null,
    dropQuery: new Set(spec.dropQuery.map((q) => q.toLowerCase())),
    overrideQuery: new Set(spec.overrideQuery.map((q) => q.toLowerCase())),
    cost: spec.cost,
    secretEnvs: spec.secretEnvs,
    unauthorized: spec.unauthorized ?? null,
    capacity: routeCapacity(o, spec.name, creds.length, MAX_CREDENTIALS),
    stripHeaders: requestStripSet([...spec.stripHeaders, ...METHOD_OVERRIDE_HEADERS], credential === null ? null : credential[0]),
  };
}

/** KEYWARD_NATIVE_AUTH: the routes that also take the client token where their SDK sends its key. */
function nativeRoutes(o: Options, specs: readonly UpstreamSpec[]): ReadonlySet<string> {
  const names = (o.get('KEYWARD_NATIVE_AUTH') ?? '')
    .split(',')
    .map((n) => n.trim())
    .filter((n) => n !== '');
  const known = new Set(specs.map((u) => u.name));
  for (const n of names) if (!known.has(n)) o.problem(`KEYWARD_NATIVE_AUTH: unknown route ${n} (routes: ${[...known].join(', ')})`);
  return new Set(names);
}

/** Every provider's route; a route whose URL is wrong is left out (its problem is recorded). */
export function routes(o: Options, readFile: ReadFile, specs: readonly UpstreamSpec[]): Route[] {
  const native = nativeRoutes(o, specs);
  return specs.map((spec, i) => route(o, spec, i, readFile, native)).filter((r): r is Route => r !== null);
}
