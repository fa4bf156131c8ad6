// Argument parsing and the commands of `bin/keyward` (design §5). Talks to
// the terminal; everything it needs from the process comes in through `Io`.
import { readFileSync } from 'node:fs';
import type { Writable } from 'node:stream';
import { parseArgs, type ParseArgsOptionsConfig } from 'node:util';
import { ConfigError, keysFilePath, loadConfig, type Env } from './config.ts';
import { runDemo } from './demo.ts';
import { FileKeyStore, KeysFileError } from './keys/file-store.ts';
import type { KeyRecord } from './keys/keyset.ts';
import { createKey, KeyUsageError, listKeys, revokeKey } from './keys/manage.ts';
import { createLogger } from './log.ts';
import { createGateway } from './server.ts';
import { parseDuration } from './units.ts';

export interface Io {
  readonly env: Env;
  readonly cwd: string;
  readonly stdout: Writable;
  readonly stderr: Writable;
  /** Where SIGTERM, SIGINT and SIGHUP arrive (the process). */
  readonly signals: NodeJS.EventEmitter;
}

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
export const EXIT_USAGE = 2;

const USAGE = `usage: keyward <command>

  serve                                        run the gateway (configuration from the environment)
  keys create --name NAME [--expires-in 30d] [--json]
                                               create a key; prints its token once
  keys list [--json]                           list keys (never tokens or digests)
  keys revoke ID|NAME                          revoke a key; the gateway refuses it within a second
  demo                                         run stand-in upstreams, the gateway and a demo key
`;

class UsageError extends Error {}

function parse(args: string[], options: ParseArgsOptionsConfig, positionals = 0): ReturnType<typeof parseArgs> {
  let parsed: ReturnType<typeof parseArgs>;
  try {
    parsed = parseArgs({ args, options, allowPositionals: positionals > 0, strict: true });
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  if (parsed.positionals.length > positionals) throw new UsageError(`unexpected argument ${parsed.positionals[positionals]}`);
  return parsed;
}

function line(out: Writable, text: string): void {
  out.write(`${text}\n`);
}

function publicView(r: KeyRecord): Omit<KeyRecord, 'digest'> {
  return { id: r.id, name: r.name, created: r.created, expires: r.expires, revoked: r.revoked };
}

async function keysCommand(args: string[], io: Io): Promise<number> {
  const [sub, ...rest] = args;
  const store = new FileKeyStore(keysFilePath(io.env, io.cwd));
  switch (sub) {
    case 'create': {
      const { values } = parse(rest, { name: { type: 'string' }, 'expires-in': { type: 'string' }, json: { type: 'boolean' } });
      if (typeof values.name !== 'string') throw new UsageError('keys create needs --name NAME');
      let expiresIn: number | null = null;
      if (typeof values['expires-in'] === 'string') {
        expiresIn = parseDuration(values['expires-in']);
        if (expiresIn === null || expiresIn <= 0) throw new UsageError('--expires-in must be a duration such as 12h, 30d or 90m');
      }
      const { record, token } = await createKey(store, values.name, expiresIn);
      if (values.json === true) {
        line(io.stdout, JSON.stringify({ ...publicView(record), token }));
      } else {
        line(io.stdout, `Created key ${record.id} (name ${record.name}, expires ${record.expires ?? 'never'}).`);
        line(io.stdout, 'Token (shown this once; only its SHA-256 digest is stored):');
        line(io.stdout, token);
      }
      return EXIT_OK;
    }
    case 'list': {
      const { values } = parse(rest, { json: { type: 'boolean' } });
      const records = await listKeys(store);
      if (values.json === true) {
        line(io.stdout, JSON.stringify(records.map(publicView)));
        return EXIT_OK;
      }
      const rows = [['ID', 'NAME', 'CREATED', 'EXPIRES', 'REVOKED'], ...records.map((r) => [r.id, r.name, r.created, r.expires ?? '-', r.revoked ?? '-'])];
      const widths = rows[0]!.map((_, c) => Math.max(...rows.map((row) => row[c]!.length)));
      for (const row of rows) line(io.stdout, row.map((cell, c) => cell.padEnd(widths[c]!)).join('  ').trimEnd());
      return EXIT_OK;
    }
    case 'revoke': {
      const { positionals } = parse(rest, {}, 1);
      if (positionals.length !== 1) throw new UsageError('keys revoke needs ID or NAME');
      const record = await revokeKey(store, positionals[0] as string);
      line(io.stdout, `Revoked key ${record.id} (name ${record.name}) at ${record.revoked}.`);
      return EXIT_OK;
    }
    default:
      throw new UsageError(sub === undefined ? 'keys needs create, list or revoke' : `unknown keys command ${sub}`);
  }
}

async function serveCommand(args: string[], io: Io): Promise<number> {
  parse(args, {});
  const config = loadConfig(io.env, (p) => readFileSync(p, 'utf8'), io.cwd);
  if (config.workers > 1) {
    // Loaded only when asked for: a single-process gateway carries no cluster machinery.
    const { default: cluster } = await import('node:cluster');
    if (cluster.isPrimary) return (await import('./workers.ts')).runPrimary(config.workers, ['serve'], io);
  }
  const log = createLogger(config.logLevel);
  let gateway;
  try {
    gateway = await createGateway(config, new FileKeyStore(config.keysFile), log.logger);
    await gateway.listen();
  } catch (err) {
    log.logger.fatal({ err: { type: (err as Error).name, code: (err as NodeJS.ErrnoException).code, message: (err as Error).message } }, 'cannot start');
    log.flush();
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
      void running.shutdown().then(() => {
        log.flush();
        resolve(EXIT_OK);
      });
    };
    // `on`, not `once`: under systemd's default KillMode a worker gets SIGTERM
    // twice (directly and from the primary), and a second, unhandled one
    // would end the drain. shutdown() is idempotent.
    io.signals.on('SIGTERM', () => stop('SIGTERM'));
    io.signals.on('SIGINT', () => stop('SIGINT'));
    // systemd's `ExecReload=kill -HUP $MAINPID`: re-read the keys at once.
    io.signals.on('SIGHUP', () => void running.reloadKeys());
  });
}

export async function run(argv: string[], io: Io): Promise<number> {
  const [command, ...rest] = argv;
  try {
    switch (command) {
      case 'serve':
        return await serveCommand(rest, io);
      case 'keys':
        return await keysCommand(rest, io);
      case 'demo':
        parse(rest, {});
        return await runDemo(io);
      case 'help':
      case '--help':
      case '-h':
        io.stdout.write(USAGE);
        return EXIT_OK;
      default:
        throw new UsageError(command === undefined ? 'a command is required' : `unknown command ${command}`);
    }
  } catch (err) {
    if (err instanceof ConfigError) {
      for (const p of err.problems) line(io.stderr, `keyward: configuration: ${p}`);
      return EXIT_USAGE;
    }
    if (err instanceof UsageError || err instanceof KeyUsageError) {
      line(io.stderr, `keyward: ${err.message}`);
      if (err instanceof UsageError) io.stderr.write(USAGE);
      return EXIT_USAGE;
    }
    const message = err instanceof KeysFileError ? `keys file: ${err.message}` : (err as Error).message;
    line(io.stderr, `keyward: ${message}`);
    return EXIT_FAILURE;
  }
}
