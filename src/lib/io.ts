// The process seam every command runs against (docs/cli.md): its
// environment, directory, pid, output streams and signals, and the exit
// codes it ends with. Here, below everything, so that the gateway's
// processes and the dev tools take it without reaching up into the CLI.
import type { Writable } from 'node:stream';

export interface Io {
  /** The environment as given (config/options.ts reads it). */
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly cwd: string;
  readonly pid: number;
  readonly stdout: Writable;
  readonly stderr: Writable;
  /** Where SIGTERM, SIGINT and SIGHUP arrive (the process). */
  readonly signals: NodeJS.EventEmitter;
}

/** A command used wrongly: the message and its help text (exit 2). Thrown by the checks the CLI and the admin API share; the API answers it 400. */
export class UsageError extends Error {
  readonly code = 'KEYWARD_ERR_USAGE';
  readonly help: string;
  constructor(message: string, help: string) {
    super(message);
    this.help = help;
  }
}

/** One line of output. */
export function line(out: Writable, text: string): void {
  out.write(`${text}\n`);
}

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
/** A command line that does not parse (docs/cli.md). */
export const EXIT_USAGE = 2;
