// Running bin/keyward as a child process, with deadlines.
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { deadline } from './deadline.ts';

export const BIN = fileURLToPath(new URL('../../bin/keyward', import.meta.url));
const TSCONFIG = fileURLToPath(new URL('../../tsconfig.json', import.meta.url));

export interface Result {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

/** Environment for a child: PATH and coverage plumbing only, plus what the test gives. */
export function childEnv(extra: Record<string, string>): Record<string, string> {
  const keep = ['PATH', 'HOME', 'NODE_V8_COVERAGE', 'TMPDIR'];
  const env: Record<string, string> = {};
  for (const k of keep) if (process.env[k] !== undefined) env[k] = process.env[k];
  // Run from source: coverage of child processes then maps onto src/ directly.
  // Children load the sources through tsx, as the test process does: c8
  // merges the V8 coverage of every process by file URL and byte offset, so
  // the same file must have the same compiled text everywhere (type
  // stripping and tsx differ, and the merge would scramble both).
  const coverage: Record<string, string> =
    process.env.NODE_V8_COVERAGE === undefined ? {} : { NODE_OPTIONS: `--import ${import.meta.resolve('tsx')}`, TSX_TSCONFIG_PATH: TSCONFIG };
  // No admin listener unless a test asks for one: test files run in parallel, and the default port is fixed.
  return { ...env, KEYWARD_FROM_SOURCE: '1', KEYWARD_ADMIN_PORT: 'off', ...coverage, ...extra };
}

/** The deadline is there to catch a hang, not slowness: run from source under coverage on a loaded machine, a command takes seconds. */
export function runCli(args: string[], env: Record<string, string>, cwd?: string, timeoutMs = 60_000): Promise<Result> {
  const child = spawn(BIN, args, { env: childEnv(env), cwd, stdio: ['ignore', 'pipe', 'pipe'] });
  return deadline(collect(child), timeoutMs, `keyward ${args.join(' ')}`);
}

export function collect(child: ChildProcess): Promise<Result> {
  let stdout = '';
  let stderr = '';
  child.stdout?.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  child.stderr?.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  return new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** Start a long-running command and wait until its output contains `ready`. */
export async function startCli(
  args: string[],
  env: Record<string, string>,
  ready: string,
  stream: 'stdout' | 'stderr' = 'stdout',
  cwd?: string,
  readyMs = 20_000,
) {
  const child = spawn(BIN, args, { env: childEnv(env), cwd, stdio: ['ignore', 'pipe', 'pipe'] });
  const done = collect(child);
  let seen = '';
  let errors = '';
  child.stderr?.on('data', (d: Buffer | string) => (errors += d.toString()));
  await deadline(
    new Promise<void>((resolve, reject) => {
      child[stream]?.on('data', (d: Buffer | string) => {
        seen += d.toString();
        if (seen.includes(ready)) resolve();
      });
      void done.then((r) => reject(new Error(`exited ${r.code} before ready: ${r.stderr}`)));
    }),
    readyMs,
    `keyward ${args.join(' ')} ready`,
  );
  return { child, done, output: () => seen, errors: () => errors };
}

/** The port a `keyward serve` said it listens on, from its output. */
export function listeningPort(output: string): number {
  const line = output.split('\n').find((l) => l.includes('"msg":"keyward listening"'));
  if (line === undefined) throw new Error('no "keyward listening" line in the output');
  return (JSON.parse(line) as { port: number }).port;
}
