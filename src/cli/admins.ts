// `keyward admins …` (docs/admin-api.md, "Admin tokens"): the tokens that
// open the admin API, created (shown once), listed and revoked in the
// configured store, each change with its audit entry.
import { effectiveEnv, storeConfig } from '../config/load.ts';
import { ADMIN_ROLES, type AdminRole } from '../keys/admin-record.ts';
import { adminView, createAdmin, revokeAdmin } from '../keys/admins.ts';
import { openKeyStore } from '../keys/open.ts';
import type { UpstreamSpec } from '../request/routes.ts';
import { EXIT_OK, helpTexts, HelpRequested, line, parse, readText, UsageError, type Io } from './args.ts';
import { printable, table } from '../lib/table.ts';

export async function adminsCommand(args: string[], io: Io, providers: readonly UpstreamSpec[]): Promise<number> {
  const help = helpTexts(providers).admins;
  const [sub, ...rest] = args;
  // Every argument checked before the store is opened.
  let action: (store: ReturnType<typeof openKeyStore>) => Promise<number>;
  switch (sub) {
    case 'create': {
      const { values } = parse(rest, { name: { type: 'string' }, role: { type: 'string' }, json: { type: 'boolean' } }, help);
      if (typeof values.name !== 'string') throw new UsageError('admins create needs --name NAME', help);
      const role = (values.role ?? 'write') as AdminRole;
      if (!ADMIN_ROLES.includes(role)) throw new UsageError('--role must be read or write', help);
      const name = values.name;
      action = async (store) => {
        const { record, token } = await createAdmin(store, name, role);
        if (values.json === true) line(io.stdout, JSON.stringify({ ...adminView(record), token }));
        else {
          line(io.stdout, `Created admin token ${record.id} (name ${printable(record.name)}, role ${record.role}).`);
          line(io.stdout, 'Token (shown this once; only its SHA-256 digest is stored):');
          line(io.stdout, token);
        }
        return EXIT_OK;
      };
      break;
    }
    case 'list': {
      const { values } = parse(rest, { json: { type: 'boolean' } }, help);
      action = async (store) => {
        const admins = await store.admins();
        if (values.json === true) line(io.stdout, JSON.stringify(admins.map(adminView)));
        else if (admins.length === 0) line(io.stdout, 'No admin tokens yet; keyward admins create --name NAME makes one.');
        else
          for (const l of table([
            ['ID', 'NAME', 'ROLE', 'CREATED', 'REVOKED'],
            ...admins.map((a) => [a.id, printable(a.name), a.role, a.created, a.revoked ?? '-']),
          ]))
            line(io.stdout, l);
        return EXIT_OK;
      };
      break;
    }
    case 'revoke': {
      const { positionals } = parse(rest, {}, help, 1);
      const target = positionals[0];
      if (target === undefined) throw new UsageError('admins revoke needs ID or NAME', help);
      action = async (store) => {
        const { record, already } = await revokeAdmin(store, target);
        line(
          io.stdout,
          already
            ? `Admin token ${record.id} (name ${printable(record.name)}) was already revoked at ${record.revoked}.`
            : `Revoked admin token ${record.id} (name ${printable(record.name)}) at ${record.revoked}.`,
        );
        return EXIT_OK;
      };
      break;
    }
    case 'help':
    case '--help':
    case '-h':
      throw new HelpRequested(help);
    default:
      throw new UsageError(sub === undefined ? 'admins needs a command: create, list or revoke' : `unknown admins command ${sub}`, help);
  }
  const store = openKeyStore(storeConfig(effectiveEnv(io.env, readText), io.cwd, readText, providers));
  try {
    line(io.stderr, `keyward: ${store.title ?? store.location}`);
    return await action(store);
  } finally {
    await store.close?.();
  }
}
