// The commands of `bin/keyward` (docs/cli.md), dispatched, and every error
// turned into its exit code and one line on stderr. Everything it needs from
// the process comes in through `Io`.
import { readFileSync } from 'node:fs';
import { nearest } from './config/unknown.ts';
import { readConfigHelp } from './cli/help-config.ts';
import { EXIT_FAILURE, EXIT_OK, EXIT_USAGE, helpTexts, line, parse, UsageError, type Io } from './cli/args.ts';
import { dbCommand } from './cli/db.ts';
import { keysCommand } from './cli/keys.ts';
import { serveCommand } from './cli/serve.ts';
import { usageCommand } from './cli/usage.ts';
import { auditCommand } from './cli/audit.ts';
import { adminsCommand } from './cli/admins.ts';
import { runDemo } from './dev/demo.ts';
import { runDevDb } from './dev/dev-db.ts';
import type { UpstreamSpec } from './request/routes.ts';
import { failureOf } from './cli/failures.ts';
import { asError } from './lib/error.ts';

export { EXIT_FAILURE, EXIT_OK, EXIT_USAGE, type Io } from './cli/args.ts';

const COMMANDS = ['serve', 'keys', 'admins', 'db', 'usage', 'audit', 'demo', 'dev-db', 'help', 'version'];

/** The installed version: package.json's, beside src/ and dist/ alike. */
function version(): string {
  const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as { version?: unknown };
  return typeof pkg.version === 'string' ? pkg.version : 'unknown';
}

/** `providers`: the provider table (routes.ts), which main.ts passes in; every command reads it from here. */
export async function run(argv: string[], io: Io, providers: readonly UpstreamSpec[]): Promise<number> {
  const [command, ...rest] = argv;
  const HELP = helpTexts(providers);
  try {
    switch (command) {
      case 'serve':
        return await serveCommand(rest, io, providers);
      case 'keys':
        return await keysCommand(rest, io, providers);
      case 'db':
        return await dbCommand(rest, io, providers);
      case 'usage':
        return await usageCommand(rest, io, providers);
      case 'audit':
        return await auditCommand(rest, io, providers);
      case 'admins':
        return await adminsCommand(rest, io, providers);
      case 'demo':
        parse(rest, {}, HELP.demo);
        return await runDemo(io, providers);
      case 'dev-db': {
        const { values } = parse(rest, { dir: { type: 'string' }, port: { type: 'string' } }, HELP['dev-db']);
        const port = values.port === undefined ? null : Number(values.port);
        if (port !== null && !(Number.isInteger(port) && port > 0 && port < 65536))
          throw new UsageError('--port must be a whole number from 1 to 65535', HELP['dev-db']);
        return await runDevDb(typeof values.dir === 'string' ? values.dir : 'keyward-dev-db', port, io);
      }
      case 'help':
      case '--help':
      case '-h':
        // `keyward help config`: every option; `keyward help <command>`: that command's help.
        if (rest[0] === 'config') {
          io.stdout.write(readConfigHelp());
          return EXIT_OK;
        }
        io.stdout.write(rest[0] !== undefined && rest[0] in HELP ? (HELP[rest[0] as keyof typeof HELP] as string) : HELP['']);
        return EXIT_OK;
      case 'version':
      case '--version':
      case '-v':
        line(io.stdout, `keyward ${version()}`);
        return EXIT_OK;
      default: {
        if (command === undefined) throw new UsageError('a command is required', HELP['']);
        const meant = nearest(command, COMMANDS);
        throw new UsageError(`unknown command ${command}${meant === null ? '' : `; did you mean ${meant}?`}`, HELP['']);
      }
    }
  } catch (err) {
    // By stable code (cli/failures.ts): one switch, no class chain.
    const f = failureOf(err);
    switch (f?.code) {
      case 'KEYWARD_HELP':
        io.stdout.write(f.text);
        return EXIT_OK;
      case 'KEYWARD_ERR_CONFIG':
        for (const p of f.problems) line(io.stderr, `keyward: configuration: ${p}`);
        return EXIT_USAGE;
      case 'KEYWARD_ERR_USAGE':
        line(io.stderr, `keyward: ${f.message}`);
        io.stderr.write(f.help);
        return EXIT_USAGE;
      case 'KEYWARD_ERR_KEY_USAGE':
        line(io.stderr, `keyward: ${f.message}`);
        return EXIT_USAGE;
      case 'KEYWARD_ERR_KEYS_FILE':
        line(io.stderr, `keyward: keys file: ${f.message}`);
        return EXIT_FAILURE;
      default:
        line(io.stderr, `keyward: ${asError(err).message}`);
        return EXIT_FAILURE;
    }
  }
}
