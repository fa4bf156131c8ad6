// `keyward audit` and `keyward audit verify` (docs/cli.md, docs/operations.md
// "Audit log"): the log of key changes from the configured store (beside the
// keys file, or PostgreSQL), listed, or its hash chain checked.
import { effectiveEnv, storeConfig } from '../config/load.ts';
import { type AuditEntry } from '../keys/audit.ts';
import { auditOf, headOf, parseHead } from '../keys/audit-check.ts';
import { openKeyStore } from '../keys/open.ts';
import type { UpstreamSpec } from '../request/routes.ts';
import { EXIT_FAILURE, EXIT_OK, helpTexts, line, parse, readText, UsageError, type Io } from './args.ts';
import { printable, table } from '../lib/table.ts';
import { sinceDay } from '../views/usage-report.ts';

/** Who, in one cell: `cli alice`, `admin deploy-bot from 10.0.0.5`. */
function who(e: AuditEntry): string {
  const a = e.actor as Partial<{ kind: string; user: string; name: string; address: string }> | undefined;
  if (a?.kind === 'admin') return `admin ${a.name ?? '?'} from ${a.address ?? '?'}`;
  return `cli ${a?.user ?? '?'}`;
}

/** What changed, in one cell: `limits: {"quota":"5/day"} → null`. */
function what(e: AuditEntry): string {
  return Object.entries(e.changes ?? {})
    .map(([f, [a, b]]) => `${f}: ${JSON.stringify(a)} → ${JSON.stringify(b)}`)
    .join('; ');
}

export async function auditCommand(args: string[], io: Io, providers: readonly UpstreamSpec[]): Promise<number> {
  const help = helpTexts(providers).audit;
  const verifying = args[0] === 'verify';
  const { values } = parse(
    verifying ? args.slice(1) : args,
    verifying ? { head: { type: 'string', multiple: true } } : { since: { type: 'string' }, json: { type: 'boolean' } },
    help,
  );
  const given = ((values.head as string[] | undefined) ?? []).map((text) => {
    const head = parseHead(text);
    if (head === null) throw new UsageError('--head must be SEQ:HASH as the gateway logged it ("audit log head", auditHead)', help);
    return { head, from: '--head' };
  });
  const since = typeof values.since === 'string' ? sinceDay(values.since, Date.now(), help) : null;
  const env = effectiveEnv(io.env, readText);
  const store = openKeyStore(storeConfig(env, io.cwd, readText, providers));
  try {
    line(io.stderr, `keyward: audit log of the ${store.title ?? store.location}`);
    const entries = await store.auditEntries();
    if (verifying) {
      const broken = await auditOf(store, entries, given);
      if (broken === null) {
        const head = headOf(entries);
        line(
          io.stdout,
          `The audit log is whole: ${entries.length} ${entries.length === 1 ? 'entry' : 'entries'}, each chained to the one before, ending where the store recorded it${given.length > 0 ? ' and at the head given' : ''}, and every key and admin token as its entries say${head === null ? '' : ` (head ${head.seq}:${head.hash})`}.`,
        );
        return EXIT_OK;
      }
      line(io.stdout, broken.seq === null ? `The audit log is broken: ${broken.why}.` : `The audit log is broken at entry ${broken.seq}: ${broken.why}.`);
      return EXIT_FAILURE;
    }
    const shown = since === null ? entries : entries.filter((e) => typeof e.at === 'string' && e.at.slice(0, 10) >= since);
    if (values.json === true) {
      line(io.stdout, JSON.stringify(shown));
      return EXIT_OK;
    }
    if (shown.length === 0) {
      line(io.stdout, since === null ? 'No changes to keys recorded yet.' : `No changes to keys recorded since ${since}.`);
      return EXIT_OK;
    }
    const rows = shown.map((e) => [String(e.seq), e.at, who(e), e.action, e.target.id, printable(e.target.name), printable(what(e))]);
    for (const l of table([['SEQ', 'AT', 'BY', 'ACTION', 'KEY', 'NAME', 'CHANGES'], ...rows])) line(io.stdout, l);
    return EXIT_OK;
  } finally {
    await store.close?.();
  }
}
