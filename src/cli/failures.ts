// What a command can fail with, told apart by a stable code as undici's
// errors are (https://undici.nodejs.org/#/docs/api/Errors): one switch on
// `code`, no class chain, and each case typed by it.
import type { ConfigError } from '../config/options.ts';
import type { KeysFileError } from '../keys/file-store.ts';
import type { KeyUsageError } from '../keys/manage.ts';
import type { BindError } from '../process/listen.ts';
import type { HelpRequested, UsageError } from './args.ts';

export type Failure = ConfigError | UsageError | HelpRequested | KeyUsageError | KeysFileError | BindError;

const CODES: ReadonlySet<string> = new Set<Failure['code']>([
  'KEYWARD_ERR_CONFIG',
  'KEYWARD_ERR_USAGE',
  'KEYWARD_HELP',
  'KEYWARD_ERR_KEY_USAGE',
  'KEYWARD_ERR_KEYS_FILE',
  'KEYWARD_ERR_BIND',
]);

/** `err` as one of keyward's own failures (by its code), or null for anything else. */
export function failureOf(err: unknown): Failure | null {
  if (!(err instanceof Error) || !('code' in err) || typeof err.code !== 'string') return null;
  return CODES.has(err.code) ? (err as Failure) : null;
}
