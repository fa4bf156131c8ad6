// `keyward keys …` (docs/cli.md, docs/keys.md): every argument is checked
// before the store is opened, then one action runs against it.
import type { parseArgs } from 'node:util';
import { effectiveEnv, storeConfig } from '../config/load.ts';
import { nearest } from '../config/unknown.ts';
import { parseKeysFile, serialiseKeysFile } from '../keys/file-store.ts';
import { forRelease, RELEASES } from '../keys/compat.ts';
import { awaitsNewer, unsupportedOf, type KeyRecord } from '../keys/keyset.ts';
import { createKey, importKeys, KeyUsageError, listKeys, revokeKey, rotateKey, updateKey } from '../keys/manage.ts';
import { openKeyStore } from '../keys/open.ts';
import { keyRules } from '../request/routes.ts';
import type { KeyStore } from '../keys/store.ts';
import { leftFor } from './left.ts';
import { periodOf } from '../limits/policy.ts';
import { LedgerDamaged, readUsageStore } from '../ledger/open.ts';
import { describeLimits, LIMIT_OPTIONS } from './limits.ts';
import { durationOption, keyChangesOf, newKeyOptions } from '../keys/changes.ts';
import { printable, table } from '../lib/table.ts';
import type { UpstreamSpec } from '../request/routes.ts';
import { EXIT_OK, helpTexts, HelpRequested, line, parse, readText, UsageError, type Io } from './args.ts';
import type { UsageRow } from '../ledger/store.ts';
import { failureOf } from './failures.ts';
import { asError } from '../lib/error.ts';

const KEYS_COMMANDS = ['create', 'list', 'revoke', 'rotate', 'update', 'import', 'export', 'help'];

function publicView(r: KeyRecord, lastUsed: string | null = null): Record<string, unknown> {
  return {
    id: r.id,
    name: r.name,
    ...(r.externalId === undefined ? {} : { externalId: r.externalId }),
    routes: r.routes ?? null,
    created: r.created,
    expires: r.expires,
    revoked: r.revoked,
    lastUsed,
    ...(r.limits === undefined ? {} : { limits: r.limits }),
    // Written by a newer keyward with rules this one cannot enforce (docs/keys.md, "Versions").
    ...(unsupportedOf(r) === null ? {} : { unsupported: unsupportedOf(r) }),
  };
}

export async function keysCommand(args: string[], io: Io, providers: readonly UpstreamSpec[]): Promise<number> {
  const HELP = helpTexts(providers);
  const [sub, ...rest] = args;
  if (sub === undefined || sub === '--help' || sub === '-h' || sub === 'help') {
    if (sub === undefined) throw new UsageError('keys needs a command: create, list, revoke, rotate, update, import or export', HELP.keys);
    // `keys help create` is `keys create --help`.
    const about = sub === 'help' ? rest[0] : undefined;
    throw new HelpRequested((about === undefined ? undefined : HELP[`keys ${about}`]) ?? HELP.keys);
  }
  const command = `keys ${sub}`;
  const help = HELP[command];
  if (help === undefined) {
    const meant = nearest(sub, KEYS_COMMANDS);
    throw new UsageError(`unknown keys command ${sub}${meant === null ? '' : `; did you mean ${meant}?`}`, HELP.keys);
  }
  const action = keysAction(sub, rest, command, help, providers);
  const store = openKeyStore(storeConfig(effectiveEnv(io.env, readText), io.cwd, readText, providers));
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

/** A keys command with its arguments checked: it only needs the store to run. */
type KeysAction = (store: KeyStore, io: Io, noteForced: () => void) => Promise<number>;

const FORCE = { force: { type: 'boolean' } } as const;

/** What every keys command's argument check reads. */
interface KeysContext {
  readonly rest: string[];
  readonly command: string;
  readonly help: string;
  /** The routes a key may name. */
  readonly names: readonly string[];
  /** The routes whose cost a budget may cap. */
  readonly costly: readonly string[];
  /** Routes whose runs are settled after the fact: where a run cap applies. */
  readonly runRoutes: readonly string[];
}

/**
 * Check every argument of a keys command before touching the store, so that
 * a usage error never prints the store line and never opens a database.
 */
function keysAction(sub: string, rest: string[], command: string, help: string, providers: readonly UpstreamSpec[]): KeysAction {
  const ctx: KeysContext = { rest, command, help, ...keyRules(providers) };
  return (KEYS_ACTIONS[sub] ?? updateAction)(ctx);
}

/** The positional ID, NAME or FILE a command needs. */
function needTarget(parsed: ReturnType<typeof parseArgs>, command: string, help: string, what = 'ID or NAME'): string {
  const target = parsed.positionals[0];
  if (target === undefined) throw new UsageError(`${command} needs ${what}`, help);
  return target;
}

function createAction({ rest, help, names, costly, runRoutes }: KeysContext): KeysAction {
  const { values } = parse(
    rest,
    {
      name: { type: 'string' },
      routes: { type: 'string' },
      'expires-in': { type: 'string' },
      'external-id': { type: 'string' },
      json: { type: 'boolean' },
      ...LIMIT_OPTIONS,
      ...FORCE,
    },
    help,
  );
  const { name, options } = newKeyOptions(values, { names, costly, runRoutes }, help);
  return async (store, io, noteForced) => {
    const { record, token } = await createKey(store, name, options, Date.now(), {
      force: values.force === true,
    });
    noteForced();
    if (values.json === true) {
      line(io.stdout, JSON.stringify({ ...publicView(record), token }));
    } else {
      line(
        io.stdout,
        `Created key ${record.id} (name ${printable(record.name)}, routes ${record.routes?.join(',') ?? 'all'}, expires ${record.expires ?? 'never'}${record.limits === undefined ? '' : `, limits ${describeLimits(record.limits)}`}).`,
      );
      line(io.stdout, 'Token (shown this once; only its SHA-256 digest is stored):');
      line(io.stdout, token);
    }
    return EXIT_OK;
  };
}

function listAction({ rest, help }: KeysContext): KeysAction {
  const { values } = parse(rest, { json: { type: 'boolean' } }, help);
  return async (store, io) => {
    const [records, used] = await Promise.all([listKeys(store), store.lastUse()]);
    // A key written by a newer keyward may hold limits this version cannot read: shown as stored, never computed with.
    const readable = records.filter((r) => unsupportedOf(r) === null);
    const usage = await usageThisMonth(store, readable, (text) => line(io.stderr, text));
    const left = new Map(readable.map((r) => [r.id, leftFor(r, usage)]));
    if (values.json === true) {
      line(io.stdout, JSON.stringify(records.map((r) => ({ ...publicView(r, used.get(r.id) ?? null), ...(left.get(r.id) ? { left: left.get(r.id) } : {}) }))));
      return EXIT_OK;
    }
    // A LIMITS column only once some key has limits: the table stays as it was for those who use none.
    const limited = records.some((r) => r.limits !== undefined);
    const rows = [
      ['ID', 'NAME', 'ROUTES', 'CREATED', 'EXPIRES', 'REVOKED', 'LAST USED', ...(limited ? ['LIMITS'] : [])],
      ...records.map((r) => [
        r.id,
        r.name,
        r.routes?.join(',') ?? 'all',
        r.created,
        r.expires ?? '-',
        r.revoked ?? '-',
        used.get(r.id) ?? '-',
        ...(limited ? [unsupportedOf(r) === null ? describeLimits(r.limits, left.get(r.id) ?? null) : 'needs a newer keyward'] : []),
      ]),
    ];
    for (const l of table(rows)) line(io.stdout, l);
    const now = Date.now();
    const newer = records.filter((r) => awaitsNewer(r, now));
    if (newer.length > 0)
      line(
        io.stderr,
        `${newer.length} key${newer.length === 1 ? ' needs' : 's need'} a newer keyward (refused with 503 key_unsupported here): ${newer.map((r) => `${r.id} (${unsupportedOf(r) ?? ''})`).join('; ')}`,
      );
    return EXIT_OK;
  };
}

function importAction({ rest, command, help, costly }: KeysContext): KeysAction {
  const file = needTarget(parse(rest, {}, command, 1), command, help, 'FILE');
  // Read and checked before the store is opened: a bad argument changes nothing.
  const incoming = readKeysArgument(file, costly);
  return async (store, io) => {
    const added = await importKeys(store, incoming);
    line(io.stdout, `Imported ${added} of ${incoming.length} keys (${incoming.length - added} were already there).`);
    return EXIT_OK;
  };
}

function exportAction({ rest, help }: KeysContext): KeysAction {
  const { values } = parse(rest, { for: { type: 'string' } }, help);
  const target = typeof values.for === 'string' ? values.for : null;
  const release = target === null ? null : (RELEASES[target] ?? null);
  if (target !== null && release === null)
    throw new UsageError(`--for must name an older release: ${Object.keys(RELEASES).join(', ')} (later ones read this version's keys as they are)`, help);
  return async (store, io) => {
    const records = await store.load();
    if (release === null) {
      io.stdout.write(serialiseKeysFile(records));
      return EXIT_OK;
    }
    // docs/keys.md, "Rolling back to 0.1.0": what that release cannot enforce is dropped, and its key refused.
    const written = forRelease(records, release, Date.now());
    for (const k of written.refused)
      line(io.stderr, `keyward: key ${k.id} (${printable(k.name)}) is written revoked: ${target} cannot enforce ${k.dropped.join(', ')}`);
    io.stdout.write(serialiseKeysFile(written.records));
    return EXIT_OK;
  };
}

function revokeAction({ rest, command, help }: KeysContext): KeysAction {
  const parsed = parse(rest, { ...FORCE }, help, 1);
  const target = needTarget(parsed, command, help);
  return async (store, io, noteForced) => {
    const { record, already } = await revokeKey(store, target, Date.now(), { force: parsed.values.force === true });
    noteForced();
    line(
      io.stdout,
      already
        ? `Key ${record.id} (name ${printable(record.name)}) was already revoked at ${record.revoked}.`
        : `Revoked key ${record.id} (name ${printable(record.name)}) at ${record.revoked}.`,
    );
    return EXIT_OK;
  };
}

function rotateAction({ rest, command, help }: KeysContext): KeysAction {
  const parsed = parse(rest, { grace: { type: 'string' }, json: { type: 'boolean' }, ...FORCE }, help, 1);
  const target = needTarget(parsed, command, help);
  const { values } = parsed;
  const graceMs = typeof values.grace === 'string' ? durationOption('grace', values.grace, help, true) : 0;
  return async (store, io, noteForced) => {
    const { record, token, graceUntil } = await rotateKey(store, target, graceMs, Date.now(), { force: values.force === true });
    noteForced();
    // The key's last use stays its own across a rotation, as `keys list` shows it.
    const lastUsed = (await store.lastUse()).get(record.id) ?? null;
    if (values.json === true) {
      line(io.stdout, JSON.stringify({ ...publicView(record, lastUsed), token, graceUntil }));
    } else {
      line(
        io.stdout,
        `Rotated key ${record.id} (name ${printable(record.name)}); the old token ${graceUntil !== null ? `works until ${graceUntil}` : 'stopped working'}.`,
      );
      line(io.stdout, 'New token (shown this once):');
      line(io.stdout, token);
    }
    return EXIT_OK;
  };
}

function updateAction({ rest, command, help, names, costly, runRoutes }: KeysContext): KeysAction {
  const parsed = parse(
    rest,
    { routes: { type: 'string' }, 'expires-in': { type: 'string' }, 'external-id': { type: 'string' }, ...LIMIT_OPTIONS, ...FORCE },
    help,
    1,
  );
  const target = needTarget(parsed, command, help);
  const { values } = parsed;
  const changes = keyChangesOf(values, { names, costly, runRoutes }, help);
  return async (store, io, noteForced) => {
    const record = await updateKey(store, target, changes, Date.now(), { force: values.force === true });
    noteForced();
    line(
      io.stdout,
      `Updated key ${record.id} (name ${printable(record.name)}): routes ${record.routes?.join(',') ?? 'all'}, expires ${record.expires ?? 'never'}${record.limits === undefined ? '' : `, limits ${describeLimits(record.limits)}`}.`,
    );
    return EXIT_OK;
  };
}

const KEYS_ACTIONS: Readonly<Record<string, (ctx: KeysContext) => KeysAction>> = {
  create: createAction,
  list: listAction,
  import: importAction,
  export: exportAction,
  revoke: revokeAction,
  rotate: rotateAction,
};

/** The keys file given to `keys import`, read and checked; errors name the file and say what it must be. */
function readKeysArgument(file: string, costly: readonly string[]): KeyRecord[] {
  let text: string;
  try {
    text = readText(file);
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' ? 'no such file' : code === 'EISDIR' ? 'it is a folder' : code === 'EACCES' ? 'permission denied' : (code ?? 'error');
    throw new KeyUsageError(`keys import: cannot read ${file} (${why}); give the path of a keys file, such as one written by keys export`);
  }
  try {
    return parseKeysFile(text, costly);
  } catch (err) {
    if (failureOf(err)?.code !== 'KEYWARD_ERR_KEYS_FILE') throw err;
    throw new KeyUsageError(`keys import: ${file} is not a keys file (${asError(err).message}); give a file written by keys export or a gateway's keys.json`);
  }
}

/** This month's ledger rows, when some key has a quota or budget and the store keeps a ledger file. */
async function usageThisMonth(store: KeyStore, records: readonly KeyRecord[], warn: (text: string) => void): Promise<UsageRow[]> {
  if (!records.some((r) => r.limits?.quota !== undefined || r.limits?.budgets !== undefined)) return [];
  const since = `${periodOf('month', Date.now()).key}-01`;
  let ledger;
  try {
    ledger = readUsageStore(store.location, store);
  } catch (err) {
    // The keys are listed all the same; what is left of their limits cannot be said.
    if (!(err instanceof LedgerDamaged)) throw err;
    warn(`keyward: ${err.message}`);
    return [];
  }
  if (ledger === null) return [];
  try {
    return await ledger.rows({ since });
  } finally {
    await ledger.close();
  }
}
