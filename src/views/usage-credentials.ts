// `keyward usage --by credential` (docs/credentials.md, "Seen"): each
// provider account's answers and cost per UTC day, from the ledger's rows
// for routes with several credentials, so each account's bill can be
// checked. Credentials are named by their number, never by their secret.
import type { CredentialRow } from '../ledger/store.ts';
import { micro } from '../lib/format.ts';
import { EXIT_OK, line, type Io } from '../lib/io.ts';
import { csv, table } from '../lib/table.ts';

type Units = Readonly<Record<string, string | null>>;

export function printCredentialRows(
  rows: readonly CredentialRow[],
  units: Units,
  values: { json?: unknown; csv?: unknown },
  range: { since: string; until: string | null },
  io: Pick<Io, 'stdout'>,
): number {
  if (values.json === true) {
    const view = rows.map((r) => ({
      route: r.route,
      credential: r.credential,
      day: r.day,
      requests: r.requests,
      status: { '2xx': r.s2xx, '3xx': r.s3xx, '4xx': r.s4xx, '5xx': r.s5xx, other: r.other },
      cost: r.cost,
      costUnit: units[r.route] ?? null,
    }));
    line(io.stdout, JSON.stringify(view));
    return EXIT_OK;
  }
  const header = ['day', 'route', 'credential', 'requests', '2xx', '3xx', '4xx', '5xx', 'other', 'cost', 'costUnit'];
  const cells = rows.map((r) =>
    [r.day, r.route, r.credential, r.requests, r.s2xx, r.s3xx, r.s4xx, r.s5xx, r.other, micro(r.cost), units[r.route] ?? ''].map(String),
  );
  if (values.csv === true) {
    for (const l of csv([header, ...cells])) line(io.stdout, l);
    return EXIT_OK;
  }
  if (cells.length === 0) {
    const when = range.until === null ? `since ${range.since}` : `from ${range.since} to ${range.until}`;
    line(io.stdout, `No credential usage recorded ${when} (only routes with several credentials keep it).`);
    return EXIT_OK;
  }
  for (const l of table([header.map((h) => h.toUpperCase()), ...cells])) line(io.stdout, l);
  return EXIT_OK;
}
