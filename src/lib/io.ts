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

export const EXIT_OK = 0;
export const EXIT_FAILURE = 1;
/** A command line that does not parse (docs/cli.md). */
export const EXIT_USAGE = 2;
