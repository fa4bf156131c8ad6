// Reading one option at a time (docs/configuration.md): each reader returns
// a typed value or its default, and records a problem naming the option
// instead of throwing, so every problem is reported together. Pure.
import { parseDuration, parseSize } from '../lib/units.ts';

export type Env = Readonly<Record<string, string | undefined>>;
export type ReadFile = (path: string) => string;

/** Every problem of a configuration at once (exit 2). */
export class ConfigError extends Error {
  override name = 'ConfigError';
  /** Stable, as undici's are: callers switch on it (cli.ts), not on the class. */
  readonly code = 'KEYWARD_ERR_CONFIG';
  readonly problems: readonly string[];
  constructor(problems: readonly string[]) {
    super(problems.join('; '));
    this.problems = problems;
  }
}

/** Options read from one environment, with the problems found so far. */
export class Options {
  readonly env: Env;
  readonly problems: string[] = [];
  /** Every name read: what is left in the environment under KEYWARD_ is unknown (config/unknown.ts). */
  readonly asked = new Set<string>();

  constructor(env: Env) {
    this.env = env;
  }

  /** The option's value, or undefined when unset or empty (an empty value means "the default"). */
  get(name: string): string | undefined {
    this.asked.add(name);
    const v = this.env[name];
    return v === undefined || v === '' ? undefined : v;
  }

  text(name: string, fallback: string): string {
    return this.get(name) ?? fallback;
  }

  /** Set, to nothing: for most options the same as unset; where a default would hide a mistake, a problem. */
  empty(name: string): boolean {
    return this.env[name] === '';
  }

  problem(text: string): void {
    this.problems.push(text);
  }

  /** A positive duration with a unit, ms. */
  duration(name: string, fallback: string): number {
    const ms = parseDuration(this.text(name, fallback));
    if (ms === null || ms <= 0) {
      this.problem(`${name} must be a positive duration with a unit (e.g. 500ms, 30s, 5m)`);
      return 0;
    }
    return ms;
  }

  /** A size with a unit within [min, max] bytes; `hint` is the example in the message. */
  size(name: string, fallback: string, range: { min: number; max: number; hint: string } | null = null): number {
    const bytes = parseSize(this.text(name, fallback));
    if (range === null) {
      if (bytes === null) this.problem(`${name} must be a size with a unit (e.g. 10MiB, 2GiB)`);
    } else if (bytes === null || bytes < range.min || bytes > range.max) {
      this.problem(`${name} must be a size from ${range.hint}`);
    }
    return bytes ?? 0;
  }

  port(name: string, fallback: number): number {
    const text = this.get(name);
    if (text === undefined) return fallback;
    const n = Number(text);
    if (!/^\d+$/.test(text) || n > 65535) {
      this.problem(`${name} must be an integer from 0 to 65535`);
      return fallback;
    }
    return n;
  }

  /** One of `allowed`, else the fallback and a problem. */
  oneOf<T extends string>(name: string, fallback: T, allowed: readonly T[]): T {
    const text = this.get(name) ?? fallback;
    if ((allowed as readonly string[]).includes(text)) return text as T;
    this.problem(`${name} must be ${allowed.length === 2 ? `${allowed[0]} or ${allowed[1]}` : `one of ${allowed.join(', ')}`}`);
    return fallback;
  }

  /** Text of a file named by the option, or null when unset. */
  file(name: string, readFile: ReadFile): string | null {
    const path = this.get(name);
    if (path === undefined) return null;
    try {
      return readFile(path);
    } catch (err) {
      this.problem(`${name}: cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
      return null;
    }
  }
}

/**
 * `KEYWARD_CONFIG_FILE`: optional `NAME=value` lines (systemd EnvironmentFile
 * syntax without quoting rules beyond a matching pair of quotes). Values there
 * override the process environment, and the file is read again on SIGHUP, so
 * a running gateway can change any option it can apply without a restart.
 */
export function parseEnvFile(text: string): { values: Record<string, string>; problems: string[] } {
  const values: Record<string, string> = {};
  const problems: string[] = [];
  const lines = text.split(/\r?\n/);
  for (let i = 0; i < lines.length; i++) {
    const line = (lines[i] as string).trim();
    if (line === '' || line.startsWith('#') || line.startsWith(';')) continue;
    const m = /^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$/.exec(line);
    if (m === null) {
      problems.push(`KEYWARD_CONFIG_FILE line ${i + 1}: expected NAME=value`);
      continue;
    }
    let value = m[2] as string;
    if (value.length >= 2 && (value[0] === '"' || value[0] === "'") && value.at(-1) === value[0]) value = value.slice(1, -1);
    values[m[1] as string] = value;
  }
  return { values, problems };
}

/** The environment with KEYWARD_CONFIG_FILE's values laid over it. */
export function effectiveEnv(env: Env, readFile: ReadFile): Env {
  const path = env.KEYWARD_CONFIG_FILE;
  if (path === undefined || path === '') return env;
  let text: string;
  try {
    text = readFile(path);
  } catch (err) {
    throw new ConfigError([`KEYWARD_CONFIG_FILE: cannot read ${path} (${(err as NodeJS.ErrnoException).code ?? 'error'})`]);
  }
  const { values, problems } = parseEnvFile(text);
  if (problems.length > 0) throw new ConfigError(problems);
  return { ...env, ...values };
}
