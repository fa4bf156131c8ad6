// The usage report (docs/limits.md): the ledger's rows per key, route and
// UTC day (or month, or credential) as a table, JSON rows or CSV. One query
// and one writer for `keyward usage` and the admin API's `GET /v1/usage`.
import { findKey } from '../keys/manage.ts';
import type { KeyStore } from '../keys/store.ts';
import type { UpstreamSpec } from '../request/routes.ts';
import { parseDuration } from '../lib/units.ts';
import { readUsageStore } from '../ledger/open.ts';
import { usagePath } from '../ledger/sqlite-store.ts';
import { csv, table } from '../lib/table.ts';
import { EXIT_OK, line, UsageError, type Io } from '../lib/io.ts';
import type { CredentialRow, UsageRow } from '../ledger/store.ts';
import { printCredentialRows } from './usage-credentials.ts';
import { micro } from '../lib/format.ts';

const DAY_MS = 86_400_000;

/** The earliest day `--since` takes: nothing is counted before it, and year 0 or a year before the Common Era is no day PostgreSQL or SQLite compare as keyward writes them. */
const EARLIEST = '1970-01-01';

/** `--since`: a duration back from today (7d) or a UTC day (2026-11-01) that exists, from 1970-01-01 on. */
export function sinceDay(text: string, now: number, help: string, flag = '--since'): string {
  const shape = `${flag} must be a duration back from today (7d) or a day (2026-11-01)`;
  let day: string;
  if (/^\d{4}-\d{2}-\d{2}$/.test(text)) {
    const t = Date.parse(`${text}T00:00:00Z`);
    // Date.parse takes 2026-02-31 as 3 March: the day must come back as written.
    if (Number.isNaN(t) || new Date(t).toISOString().slice(0, 10) !== text) throw new UsageError(`${flag}: ${text} is not a day of the calendar`, help);
    day = text;
  } else {
    const ms = parseDuration(text);
    if (ms === null || ms < 0) throw new UsageError(shape, help);
    day = now - ms < Date.parse(`${EARLIEST}T00:00:00Z`) ? '' : new Date(now - ms).toISOString().slice(0, 10);
  }
  if (day < EARLIEST) throw new UsageError(`${flag} reaches back before ${EARLIEST}; give a later day or a shorter duration`, help);
  return day;
}

/** Each route's cost unit (the provider table's), null where its upstream reports none. */
type Units = Readonly<Record<string, string | null>>;

/** A row as `--json` prints it. */
function view(r: UsageRow, names: ReadonlyMap<string, string>, units: Units, pending: Pending): Record<string, unknown> {
  return {
    keyId: r.keyId,
    key: names.get(r.keyId) ?? null,
    route: r.route,
    day: r.day,
    requests: r.requests,
    status: { '2xx': r.s2xx, '3xx': r.s3xx, '4xx': r.s4xx, '5xx': r.s5xx, other: r.other },
    limited: r.limited,
    bytesIn: r.bytesIn,
    bytesOut: r.bytesOut,
    cost: r.cost,
    costUnit: units[r.route] ?? null,
    pendingRuns: pending.of(r),
  };
}

/**
 * Scraper runs not settled yet, by key, route and day (docs/limits.md,
 * "Scraper runs"): a row that holds any is marked, its cost booked at their
 * reservations until they end.
 */
interface Pending {
  of(r: Pick<UsageRow, 'keyId' | 'route' | 'day'>): number;
}

function pendingOf(runs: ReadonlyArray<{ keyId: string; route: string; day: string; runs: number }>): Pending {
  const by = new Map<string, number>();
  for (const r of runs) {
    // By day and by month, so that `--by month` rows are marked too.
    for (const period of [r.day, r.day.slice(0, 7)]) {
      const k = `${r.keyId}\u0000${r.route}\u0000${period}`;
      by.set(k, (by.get(k) ?? 0) + r.runs);
    }
  }
  return { of: (r) => by.get(`${r.keyId}\u0000${r.route}\u0000${r.day}`) ?? 0 };
}

/** What `keyward usage` (and `GET /v1/usage`) was asked, checked. */
export interface UsageQuery {
  readonly key: string | undefined;
  readonly route: string | undefined;
  readonly since: string;
  readonly until: string | null;
  readonly by: 'day' | 'month' | 'credential';
  readonly format: 'table' | 'json' | 'csv';
}

/** The values of `keyward usage` (the admin API spells its query the same way), every one checked before any store is opened. */
export function usageQuery(values: Record<string, unknown>, providers: readonly UpstreamSpec[], help: string, now = Date.now()): UsageQuery {
  if (values.json === true && values.csv === true) throw new UsageError('--json and --csv: choose one', help);
  if (values.by !== undefined && values.by !== 'day' && values.by !== 'month' && values.by !== 'credential')
    throw new UsageError('--by must be day, month or credential', help);
  if (values.by === 'credential' && values.key !== undefined)
    throw new UsageError('--by credential: a credential is an account of the route, shared by every key; leave out --key', help);
  const until = typeof values.until === 'string' ? sinceDay(values.until, now, help, '--until') : null;
  const route = typeof values.route === 'string' ? values.route : undefined;
  if (route !== undefined && !providers.some((u) => u.name === route)) throw new UsageError(`--route: unknown route ${route}`, help);
  const since = typeof values.since === 'string' ? sinceDay(values.since, now, help) : new Date(now - 30 * DAY_MS).toISOString().slice(0, 10);
  if (until !== null && until < since) throw new UsageError(`--until ${until} is before --since ${since}`, help);
  return {
    key: typeof values.key === 'string' ? values.key : undefined,
    route,
    since,
    until,
    by: values.by === 'month' || values.by === 'credential' ? values.by : 'day',
    format: values.json === true ? 'json' : values.csv === true ? 'csv' : 'table',
  };
}

/** The ledger's rows for `query`, written to `io.stdout` as asked (a table, JSON or CSV); where they were read from on `io.stderr`. */
export async function writeUsage(
  query: UsageQuery,
  keys: KeyStore,
  keysFile: string,
  providers: readonly UpstreamSpec[],
  help: string,
  io: Pick<Io, 'stdout' | 'stderr'>,
): Promise<number> {
  const units: Units = Object.fromEntries(providers.map((u) => [u.name, u.cost?.unit ?? null]));
  const { since, until, route } = query;
  const values = { json: query.format === 'json', csv: query.format === 'csv' };
  let rows: UsageRow[] = [];
  let credentialRows: CredentialRow[] = [];
  let pending = pendingOf([]);
  const records = await keys.load();
  const names = new Map(records.map((r) => [r.id, r.name]));
  let keyId: string | undefined;
  if (query.key !== undefined) {
    keyId = findKey(records, query.key)?.id;
    if (keyId === undefined) throw new UsageError(`--key: no key with id or name ${query.key}`, help);
  }
  const filter = { since, ...(keyId === undefined ? {} : { keyId }), ...(route === undefined ? {} : { route }) };
  const ledger = readUsageStore(keysFile, keys);
  line(io.stderr, `keyward: usage ledger ${ledger === null ? usagePath(keysFile) : keys.database === undefined ? ledger.location : `in ${ledger.location}`}`);
  if (ledger !== null) {
    try {
      if (query.by === 'credential') credentialRows = (await ledger.credentialRows?.({ since, ...(route === undefined ? {} : { route }) })) ?? [];
      else {
        rows = await ledger.rows(filter);
        pending = pendingOf((await ledger.runs?.pendingRuns()) ?? []);
      }
    } finally {
      // The shared ledger's connection is the key store's, closed by its owner.
      await ledger.close();
    }
  }
  if (until !== null) {
    rows = rows.filter((r) => r.day <= until);
    credentialRows = credentialRows.filter((r) => r.day <= until);
  }
  if (query.by === 'credential') return printCredentialRows(credentialRows, units, values, { since, until }, io);
  if (query.by === 'month') rows = byMonth(rows);
  return print(rows, names, units, pending, values, { since, until, by: query.by === 'month' ? 'month' : 'day' }, io);
}

const COUNTS = ['requests', 's2xx', 's3xx', 's4xx', 's5xx', 'other', 'limited', 'bytesIn', 'bytesOut', 'cost'] as const;

/** Rows added up per key, route and calendar month (`day` becomes `2026-11`), in the order they came. */
function byMonth(rows: readonly UsageRow[]): UsageRow[] {
  const out = new Map<string, UsageRow>();
  for (const r of rows) {
    const month = r.day.slice(0, 7);
    const k = `${r.keyId}\u0000${r.route}\u0000${month}`;
    const sum = out.get(k);
    if (sum === undefined) out.set(k, { ...r, day: month });
    else for (const c of COUNTS) sum[c] += r[c];
  }
  return [...out.values()].sort((a, b) => (a.day < b.day ? -1 : a.day > b.day ? 1 : 0));
}

/** The TOTAL rows: counts over every row, and the cost added up per unit (dollars and characters do not add). */
function totals(rows: readonly UsageRow[], units: Units): string[][] {
  const seen = [...new Set(rows.map((r) => units[r.route] ?? ''))];
  return seen.map((unit, i) => {
    const of = i === 0 ? rows : [];
    const sum = (c: (typeof COUNTS)[number]): string => String(of.reduce((n, r) => n + r[c], 0));
    const cost = rows.filter((r) => (units[r.route] ?? '') === unit).reduce((n, r) => n + r.cost, 0);
    // The counts once, on the first line; each unit's cost on its own.
    return ['TOTAL', '', '', ...(i === 0 ? COUNTS.filter((c) => c !== 'cost').map(sum) : Array<string>(9).fill('')), String(micro(cost)), unit];
  });
}

function print(
  rows: readonly UsageRow[],
  names: ReadonlyMap<string, string>,
  units: Units,
  pending: Pending,
  values: { json?: unknown; csv?: unknown },
  range: { since: string; until: string | null; by: 'day' | 'month' },
  io: Pick<Io, 'stdout'>,
): number {
  if (values.json === true) {
    line(io.stdout, JSON.stringify(rows.map((r) => view(r, names, units, pending))));
    return EXIT_OK;
  }
  const header = [range.by, 'key', 'route', 'requests', '2xx', '3xx', '4xx', '5xx', 'other', 'limited', 'bytesIn', 'bytesOut', 'cost', 'costUnit'];
  const cells = rows.map((r) =>
    [
      r.day,
      names.get(r.keyId) ?? r.keyId,
      r.route,
      r.requests,
      r.s2xx,
      r.s3xx,
      r.s4xx,
      r.s5xx,
      r.other,
      r.limited,
      r.bytesIn,
      r.bytesOut,
      r.cost,
      units[r.route] ?? '',
    ].map(String),
  );
  if (cells.length > 0) cells.push(...totals(rows, units));
  if (values.csv === true) {
    // The runs still pending per row, as the last column.
    const marked = cells.map((c, i) => [...c, String(i < rows.length ? pending.of(rows[i] as UsageRow) : '')]);
    for (const l of csv([[...header, 'pendingRuns'], ...marked])) line(io.stdout, l);
    return EXIT_OK;
  }
  // A row with runs still pending: its cost marked, and said once below the table.
  rows.forEach((r, i) => {
    const c = cells[i] as string[];
    if (pending.of(r) > 0) c[12] = `${c[12] ?? ''}*`;
  });
  const marks = rows.filter((r) => pending.of(r) > 0).reduce((n, r) => n + pending.of(r), 0);
  if (cells.length === 0) {
    line(io.stdout, range.until === null ? `No usage recorded since ${range.since}.` : `No usage recorded from ${range.since} to ${range.until}.`);
    return EXIT_OK;
  }
  for (const l of table([header.map((h) => h.toUpperCase()), ...cells])) line(io.stdout, l);
  if (marks > 0)
    line(
      io.stdout,
      `* ${marks} scraper run${marks === 1 ? '' : 's'} still pending: booked at ${marks === 1 ? 'its reservation' : 'their reservations'} until ${marks === 1 ? 'it ends' : 'they end'} and ${marks === 1 ? 'its' : 'their'} cost is asked for.`,
    );
  return EXIT_OK;
}
