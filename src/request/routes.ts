// The route table (docs/routes.md) and prefix matching. Pure: no I/O, no config
// reading. Each upstream is one entry of UPSTREAMS; a fourth provider is a new
// entry here, not new code anywhere else.
import { ERRORS, type GatewayError } from './errors.ts';
import type { KeyRules } from '../keys/changes.ts';
import type { RouteCapacity } from '../capacity/plan.ts';

/**
 * Where a provider's official SDK puts its API key (docs/keys.md, native credentials): with
 * KEYWARD_NATIVE_AUTH the gateway also takes the client token from there.
 */
export type NativeCredential =
  { readonly kind: 'header'; readonly name: string } | { readonly kind: 'basic' } | { readonly kind: 'query'; readonly name: string };

/** A request an upstream's stand-in answers (standins.ts): the demo prints it, tests send it. */
export interface Example {
  readonly method: string;
  /** After the route prefix, leading slash included. */
  readonly path: string;
  /** A JSON body. */
  readonly body?: string;
  readonly status: number;
  /** curl writes the answer to this file (audio), and streams it as it comes with `stream`. */
  readonly output?: string;
  readonly stream?: boolean;
}

/**
 * Static description of one upstream: what the gateway strips, injects and
 * allows, and what the demo, its stand-ins, the tests, the bench and the
 * soak need to know of it. A fourth provider is a new entry here.
 */
export interface UpstreamSpec {
  /** Route name; the client-facing prefix is `/${name}/`. */
  readonly name: string;
  readonly urlEnv: string;
  readonly defaultUrl: string;
  readonly methods: readonly string[];
  /** Environment names of the secrets, in the order `credential` receives them. */
  readonly secretEnvs: readonly string[];
  /** The header the upstream authenticates with, built from the secrets. */
  readonly credential: (secrets: readonly string[]) => readonly [name: string, value: string];
  /** Every form a secret could take in a response, for the egress filter (egress.ts). */
  readonly secretForms: (secrets: readonly string[]) => ReadonlyArray<{ readonly form: string; readonly value: string }>;
  /** Query parameters that carry credentials upstream; removed from every request. */
  readonly dropQuery: readonly string[];
  /** Query parameters the upstream honours as a method override; such requests are refused. */
  readonly overrideQuery: readonly string[];
  /** Client headers removed besides the hop-by-hop ones and `authorization`. */
  readonly stripHeaders: readonly string[];
  /** Where the provider's SDK sends its key. */
  readonly native: NativeCredential;
  /**
   * What a call cost, as the upstream reports it (a key's budget is in its
   * unit): a response header (the first present of `headers`), or a
   * top-level number field of a JSON body; null when it reports none.
   */
  readonly cost: {
    readonly unit: 'usd' | 'characters';
    readonly headers?: readonly string[];
    readonly jsonField?: string;
    /** The most one call can plausibly cost; a report above it counts as none (a hostile or broken upstream must not lock a budget). */
    readonly max: number;
    /**
     * The cost comes after the fact: a run-start response is a run object,
     * whose cost the gateway asks for once the run ended (ledger/runs.ts);
     * a paid start reserves the cap it is sent with (docs/limits.md).
     */
    readonly runs?: true;
  } | null;
  /**
   * What the provider's 401 says of the account (docs/credentials.md, "Set
   * aside"), read from the answer's body (decoded, at most
   * UNAUTHORIZED_BODY_MAX bytes; null when it could not be read whole):
   * `account`, the secret itself is refused (set aside until a reload);
   * `payment`, the account is out of credit (set aside as a 402); `call`,
   * this call is refused for a reason the client controls (a scoped key
   * asked for what is outside its scope): passed to the client, nothing set
   * aside. Absent: every 401 refuses the account.
   */
  readonly unauthorized?: (body: Buffer | null) => Unauthorized;
  /** Made-up secrets of the right shape, one per `secretEnvs` entry, for the demo, tests, bench and soak; `tag` makes them unique. */
  readonly sampleSecrets: (tag: string) => readonly string[];
  /** What the demo says of this provider, and the requests it shows (the first is the plainest). */
  readonly demo: { readonly title: string; readonly examples: readonly Example[] };
}

/** What a 401 refuses: the account, its credit, or only the call (UpstreamSpec.unauthorized). */
export type Unauthorized = 'account' | 'payment' | 'call';

/** The most of a 401's body read to tell what it refuses: providers' error objects are a few hundred bytes. */
export const UNAUTHORIZED_BODY_MAX = 16 * 1024;

/**
 * The voice provider's 401 names its reason in `detail.status`: only
 * `invalid_api_key` says the key itself is wrong; `quota_exceeded` is an
 * account out of characters (a 402 in all but status); anything else
 * (`missing_permissions` from a scoped key, an unreadable body) is about
 * the call, which one key holder controls and must not be able to turn into
 * every key's outage.
 */
export function speechUnauthorized(body: Buffer | null): Unauthorized {
  if (body === null) return 'call';
  let doc: unknown;
  try {
    doc = JSON.parse(body.toString('utf8'));
  } catch {
    return 'call';
  }
  const detail = (doc as { detail?: unknown } | null)?.detail;
  const status = typeof detail === 'object' && detail !== null ? (detail as { status?: unknown }).status : undefined;
  if (status === 'invalid_api_key') return 'account';
  if (status === 'quota_exceeded') return 'payment';
  return 'call';
}

export const UPSTREAMS: readonly UpstreamSpec[] = [
  {
    name: 'scraper',
    urlEnv: 'KEYWARD_SCRAPER_URL',
    defaultUrl: 'https://api.apify.com',
    methods: ['POST'],
    secretEnvs: ['KEYWARD_SCRAPER_TOKEN'],
    credential: ([token]) => ['authorization', `Bearer ${token}`],
    secretForms: ([token]) => [{ form: 'token', value: token ?? '' }],
    // The platform reads its API token from `?token=` as well as the header.
    dropQuery: ['token'],
    // The platform turns `POST ...?method=DELETE` into a DELETE.
    overrideQuery: ['method'],
    stripHeaders: [],
    native: { kind: 'query', name: 'token' },
    // The platform bills a run when it ends: settled after the fact from the
    // run object's `usageTotalUsd` (docs/limits.md, "Scraper runs"); a run
    // reserves the cap it is sent with.
    cost: { unit: 'usd', max: 10_000, runs: true },
    sampleSecrets: (tag) => [`apify_api_${tag}`],
    demo: {
      title: 'scraper: start an actor run (JSON with data.status "READY")',
      examples: [{ method: 'POST', path: '/v2/acts/apify~web-scraper/runs', body: '{"startUrls":[{"url":"https://example.com"}]}', status: 201 }],
    },
  },
  {
    name: 'seo',
    urlEnv: 'KEYWARD_SEO_URL',
    defaultUrl: 'https://api.dataforseo.com',
    methods: ['GET', 'POST'],
    secretEnvs: ['KEYWARD_SEO_LOGIN', 'KEYWARD_SEO_PASSWORD'],
    credential: ([login, password]) => ['authorization', `Basic ${Buffer.from(`${login}:${password}`).toString('base64')}`],
    // The Basic credential as sent, and the password alone (an upstream may echo either).
    secretForms: ([login, password]) => [
      { form: 'basic', value: Buffer.from(`${login}:${password}`).toString('base64') },
      { form: 'password', value: password ?? '' },
    ],
    dropQuery: [],
    overrideQuery: [],
    stripHeaders: [],
    // The SDK sends HTTP Basic with the account's login and API password.
    native: { kind: 'basic' },
    // DataForSEO: the body's top-level `cost` in USD (each task carries its own too).
    // A task costs fractions of a cent; no single call costs a thousand dollars.
    cost: { unit: 'usd', jsonField: 'cost', max: 1_000 },
    sampleSecrets: (tag) => [`seologin${tag}@example.com`, `seo_password_${tag}`],
    demo: { title: 'seo: account data (JSON with status_code 20000)', examples: [{ method: 'GET', path: '/v3/appendix/user_data', status: 200 }] },
  },
  {
    name: 'speech',
    urlEnv: 'KEYWARD_SPEECH_URL',
    defaultUrl: 'https://api.elevenlabs.io',
    methods: ['GET', 'POST', 'PATCH', 'DELETE'],
    secretEnvs: ['KEYWARD_SPEECH_KEY'],
    credential: ([key]) => ['xi-api-key', key ?? ''],
    secretForms: ([key]) => [{ form: 'key', value: key ?? '' }],
    // The voice API also accepts its key as `?xi-api-key=`.
    dropQuery: ['xi-api-key'],
    overrideQuery: [],
    stripHeaders: [],
    native: { kind: 'header', name: 'xi-api-key' },
    // ElevenLabs: characters billed, in a response header.
    // A synthesis takes at most some tens of thousands of characters.
    cost: { unit: 'characters', headers: ['character-cost', 'x-character-count'], max: 1_000_000 },
    // A scoped key answers 401 missing_permissions outside its scope.
    unauthorized: speechUnauthorized,
    sampleSecrets: (tag) => [`sk_${tag}`],
    demo: {
      title: 'speech: synthesise to a file (32 KiB of audio/mpeg), then a slow stream (64 KiB over 2 s)',
      examples: [
        { method: 'POST', path: '/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM', body: '{"text":"Hello from keyward"}', status: 200, output: 'hello.mp3' },
        { method: 'POST', path: '/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM/stream', body: '{"text":"Hello"}', status: 200, output: 'stream.mp3', stream: true },
      ],
    },
  },
];

/** The routes whose upstream reports a cost: the only ones a key's budget can hold to. */
export function costRoutes(specs: readonly UpstreamSpec[]): readonly string[] {
  return specs.filter((u) => u.cost !== null).map((u) => u.name);
}

/** The options that point `spec`'s route at `url` with `secrets` (one per `secretEnvs` entry). */
export function providerEnv(spec: UpstreamSpec, url: string, secrets: readonly string[]): Record<string, string> {
  const env: Record<string, string> = { [spec.urlEnv]: url };
  spec.secretEnvs.forEach((name, i) => (env[name] = secrets[i] ?? ''));
  return env;
}

/**
 * One of a route's credentials (docs/credentials.md): its label is its
 * number, never anything derived from the secret; logs, metrics and the
 * ledger name it by that.
 */
export interface Credential {
  readonly label: number;
  /** The header the upstream authenticates with. */
  readonly header: readonly [name: string, value: string];
  /** Its secrets' forms, for the egress filter. */
  readonly forms: ReadonlyArray<{ readonly form: string; readonly value: string }>;
}

/** A route as the request path uses it: the spec resolved against the configuration. */
export interface Route {
  readonly name: string;
  /** Position in the provider table: the route's slot in per-route counters (metrics.ts). */
  readonly index: number;
  readonly prefix: string;
  readonly methods: ReadonlySet<string>;
  /** Upstream origin; the forwarder sends to it. */
  readonly target: URL;
  /** The base URL's own path without a trailing slash ('' for none): kept as the upstream prefix. */
  readonly basePath: string;
  /** Credential 1's header; `null` when a secret is missing: the route answers 503 route_not_configured. */
  readonly credential: readonly [name: string, value: string] | null;
  /** Every credential of the route, by label (1, 2, …; docs/credentials.md); empty when not configured. */
  readonly credentials: readonly Credential[];
  /** The forms of every credential's secrets the egress filter masks; empty when not configured. */
  readonly secretForms: ReadonlyArray<{ readonly form: string; readonly value: string }>;
  /** Set when KEYWARD_NATIVE_AUTH lists the route: where else the client token may come from. */
  readonly native: NativeCredential | null;
  readonly dropQuery: ReadonlySet<string>;
  readonly overrideQuery: ReadonlySet<string>;
  /** Lower-case request header names never forwarded on this route (client credentials included). */
  readonly stripHeaders: ReadonlySet<string>;
  /** Where its upstream reports a call's cost (the provider table's), or null. */
  readonly cost: UpstreamSpec['cost'];
  /** The options its secrets are read from (the provider table's), for what an operator is told to set. */
  readonly secretEnvs: readonly string[];
  /** What a 401 refuses, read from its body (the provider table's); null: the account, always. */
  readonly unauthorized: UpstreamSpec['unauthorized'] | null;
  /** Each credential's capacity (docs/credentials.md, "Capacity"), by position; null: no option set, no request waits. */
  readonly capacity: RouteCapacity | null;
}

export type RouteTable = ReadonlyMap<string, Route>;

export function routeTable(routes: readonly Route[]): RouteTable {
  return new Map(routes.map((r) => [r.name, r]));
}

export type Match =
  | { readonly route: Route; readonly path: string; readonly query: string | null; readonly error: null }
  | { readonly route: null; readonly path: null; readonly query: null; readonly error: GatewayError };

const miss = (error: GatewayError): Match => ({ route: null, path: null, query: null, error });
const NO_ROUTE = miss(ERRORS.noRoute);
const METHOD_NOT_ON_ROUTE = miss(ERRORS.methodNotOnRoute);
const DOT_SEGMENT = miss(ERRORS.dotSegment);
const BAD_ESCAPE = miss(ERRORS.badPathEscape);

/** The route a target's first segment names, whatever the rest (for native credentials, read before routing). */
export function routeByPrefix(table: RouteTable, url: string): Route | undefined {
  if (url.charCodeAt(0) !== 47 /* / */) return undefined;
  const slash = url.indexOf('/', 1);
  return slash < 0 ? undefined : table.get(url.slice(1, slash));
}

/**
 * Match an origin-form request target (`/scraper/v2/acts?x`) to a route.
 * `path` is everything after the route prefix's last slash, leading slash
 * included, byte for byte; `query` is the raw text after the first `?`.
 */
export function matchRoute(table: RouteTable, method: string, url: string): Match {
  // Absolute-form, authority-form and `*` targets never name a route.
  if (url.charCodeAt(0) !== 47 /* / */) return NO_ROUTE;
  const slash = url.indexOf('/', 1);
  if (slash < 0) return NO_ROUTE;
  const route = table.get(url.slice(1, slash));
  if (route === undefined) return NO_ROUTE;
  const q = url.indexOf('?', slash);
  const path = q < 0 ? url.slice(slash) : url.slice(slash, q);
  if (path.length <= 1) return NO_ROUTE; // empty {path}: `/scraper/`
  if (!route.methods.has(method)) return METHOD_NOT_ON_ROUTE;
  if (hasDotSegment(path)) return DOT_SEGMENT;
  if (hasForbiddenEscape(path)) return BAD_ESCAPE;
  return { route, path, query: q < 0 ? null : url.slice(q + 1), error: null };
}

// A segment that is `.` or `..`, literally or percent-encoded (RFC 3986 §6.2.2.2
// says `%2E` is `.`), between separators. Backslash and `%2F`/`%5C` count as
// separators and `;` as an end because upstream stacks differ on them (IIS
// folds `\`, Tomcat drops `;params`), and a dot-segment that any of them
// resolves could climb out of the upstream base path.
const DOT_SEGMENT_RE = /(?:^|\/|\\|%2f|%5c)(?:\.|%2e){1,2}(?=$|\/|\\|%2f|%5c|;|%3b|#)/i;

export function hasDotSegment(path: string): boolean {
  if (path.indexOf('.') < 0 && path.indexOf('%') < 0) return false;
  return DOT_SEGMENT_RE.test(path);
}

// Escapes no URI path an upstream should see (docs/security.md), each
// a way that stacks disagree about what a path means:
// - `%00`-`%1F` and `%7F`: control characters (RFC 3986 §2.1 lets them be
//   encoded, but a NUL or CR/LF truncates or splits a path in C-based and
//   logging stacks);
// - `%uXXXX`: IIS's non-standard escape, which it decodes and nobody else does;
// - overlong UTF-8 (`%C0`/`%C1` leads, `%E0%80`-`%E0%9F`, `%F0%80`-`%F0%8F`):
//   invalid per RFC 3629 §3, and decoded as `.` or `/` by lenient decoders
//   (`%c0%ae%c0%ae` is `..`);
// - a one- or two-dot segment followed by encoded blanks (`..%20`): Windows
//   drops trailing blanks from names, turning it into `..`.
const FORBIDDEN_ESCAPE_RE =
  /%(?:[01][0-9a-f]|7f|u[0-9a-f]{4}|c[01]|e0%[89][0-9a-f]|f0%8[0-9a-f])|(?:^|\/|\\|%2f|%5c)(?:\.|%2e){1,2}(?:%20|%09|%0b|%0c)+(?=$|\/|\\|%2f|%5c|;|%3b)/i;

/** True when the path holds an escape that is refused with 400 (see above). */
export function hasForbiddenEscape(path: string): boolean {
  return path.indexOf('%') >= 0 && FORBIDDEN_ESCAPE_RE.test(path);
}

/** What a key's values are checked against (keys/changes.ts): this gateway's routes, those a budget may cap, those whose runs are settled after the fact. */
export function keyRules(providers: readonly UpstreamSpec[]): KeyRules {
  return {
    names: providers.map((u) => u.name),
    costly: costRoutes(providers),
    runRoutes: providers.filter((u) => u.cost?.runs !== undefined).map((u) => u.name),
  };
}
