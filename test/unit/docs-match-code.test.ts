// Where a document lists what the code defines, the two are compared, so
// neither can change without the other: the options (docs/configuration.md), the
// error codes (docs/responses.md, docs/limits.md), the metrics
// (docs/operations.md), the PostgreSQL migrations (docs/fleet.md) and the
// command-line flags (docs/cli.md), and the module table (ARCHITECTURE.md).
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import { sep } from 'node:path';
import { test } from 'node:test';
import { knownVariables } from '../../src/config/load.ts';
import { ELSEWHERE } from '../../src/config/unknown.ts';
import { helpTexts } from '../../src/cli/args.ts';
import { ERRORS } from '../../src/request/errors.ts';
import { MIGRATIONS } from '../../src/keys/pg-schema.ts';
import { alertCounters, backgroundFailures, capacityMetrics, runCounters, Metrics, newRegistry } from '../../src/observe/metrics.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';
import { RESTART_ONLY } from '../../src/process/runtime.ts';
import { USAGE_PAGE_CSP } from '../../src/process/admin.ts';

const read = (path: string): string => readFileSync(new URL(`../../${path}`, import.meta.url), 'utf8');

test("docs/configuration.md's option table lists every option the configuration reads, and nothing else", () => {
  const readme = read('docs/configuration.md');
  // A row's first cell names one option or several (`KEYWARD_SEO_LOGIN`, `KEYWARD_SEO_PASSWORD`).
  const firstCells = [...readme.matchAll(/^\| (`KEYWARD_[^|]*) \|/gm)].map((m) => m[1] as string);
  const rows = new Set(firstCells.flatMap((cell) => [...cell.matchAll(/`(KEYWARD_[A-Z0-9_]+)`/g)].map((m) => m[1] as string)));
  const known = new Set(knownVariables(UPSTREAMS));
  // A secret's `_FILE` twin is covered by the table's rule for secrets (`KEYWARD_<NAME>_FILE`).
  assert.match(read('docs/configuration.md'), /`NAME_FILE`|`KEYWARD_<NAME>_FILE`/);
  const missing = [...known].filter((k) => !rows.has(k) && !(k.endsWith('_FILE') && rows.has(k.slice(0, -5))));
  assert.deepEqual(missing, [], 'read by the configuration, not in the table');
  const stale = [...rows].filter((r) => !known.has(r) && !ELSEWHERE.has(r));
  assert.deepEqual(stale, [], 'in the table, read by nothing');
});

test('the options a reload cannot apply are the ones docs/configuration.md says need a restart, in its list and its table', () => {
  const docs = read('docs/configuration.md');
  const section = docs.slice(docs.indexOf('- Needing a restart'), docs.indexOf('- A port that is taken'));
  const listed = new Set([...section.matchAll(/`(KEYWARD_[A-Z0-9_]+)`/g)].map((m) => m[1] as string));
  // TLS is listed as "turning TLS on or off", by its certificate option in the code.
  const code = new Set(RESTART_ONLY.map(([name]) => name).filter((n) => n !== 'KEYWARD_TLS_CERT_FILE'));
  assert.deepEqual(
    [...code].filter((n) => !listed.has(n)),
    [],
    'restart-only in the code, not in the list',
  );
  assert.deepEqual(
    [...listed].filter((n) => !code.has(n)),
    [],
    'in the list, applied on reload by the code',
  );
  // Each table row that says "Restart to change" is one of them.
  const marked = [...docs.matchAll(/^\| `(KEYWARD_[A-Z0-9_]+)` \|.*Restart to change/gm)].map((m) => m[1] as string);
  assert.deepEqual(
    marked.filter((n) => !code.has(n)),
    [],
  );
});

test("the usage page's Content-Security-Policy is the one docs/limits.md gives", () => {
  assert.ok(read('docs/limits.md').includes(`\`Content-Security-Policy: ${USAGE_PAGE_CSP}\``));
});

test('every error code the gateway answers with is documented, and the documented ones exist', () => {
  const codes = new Set<string>(Object.values(ERRORS).map((e) => e.code));
  const docs = read('docs/responses.md') + read('docs/limits.md');
  assert.deepEqual(
    [...codes].filter((c) => !docs.includes(`\`${c}\``)),
    [],
  );
  const table = [...read('docs/responses.md').matchAll(/^\| \d{3} \| `([a-z_]+)` \|/gm)].map((m) => m[1] as string);
  assert.ok(table.length > 5);
  assert.deepEqual(
    table.filter((c) => !codes.has(c)),
    [],
  );
  // Each status with its code, as the catalogue pairs them.
  for (const e of Object.values(ERRORS))
    if (table.includes(e.code)) assert.match(read('docs/responses.md'), new RegExp(`^\\| ${e.status} \\| \`${e.code}\``, 'm'), e.code);
});

test("every keyward_ metric is in docs/operations.md's list, and the list names no other", async () => {
  // The gateway's series, and the alerts', runs' and background tasks' counters of the process that decides limits (metrics.ts, fired by alerts/spend.ts, the run settler and observe/outages.ts).
  const alerts = newRegistry();
  alertCounters(alerts, () => 0).fired.inc({ kind: 'quota', threshold: '80' });
  runCounters(alerts);
  backgroundFailures(alerts);
  // The capacity's, in the registry of the process that holds the counts.
  capacityMetrics(alerts, () => null);
  const text = (await new Metrics({ defaults: false, routes: ['scraper'] }).text()) + (await alerts.metrics());
  const served = new Set([...text.matchAll(/^# HELP (keyward_[a-z_]+)/gm)].map((m) => m[1] as string));
  assert.ok(served.size > 5);
  const section = read('docs/operations.md').split('## Metrics')[1]?.split('\n## ')[0] ?? '';
  const listed = new Set([...section.matchAll(/`(keyward_[a-z_]+)/g)].map((m) => m[1] as string));
  assert.deepEqual(
    [...served].filter((m) => !listed.has(m)),
    [],
    'served, not documented',
  );
  assert.deepEqual(
    [...listed].filter((m) => !served.has(m)),
    [],
    'documented, not served',
  );
});

test('docs/fleet.md lists each migration, numbered as the schema applies them', () => {
  const section = read('docs/fleet.md').split('Versioned migrations')[1]?.split('\n## ')[0] ?? '';
  const numbers = [...section.matchAll(/^(\d+)\. /gm)].map((m) => Number(m[1]));
  assert.deepEqual(
    numbers,
    MIGRATIONS.map((_, i) => i + 1),
  );
});

test("docs/cli.md names every flag the commands' help texts name, and no other", () => {
  const flags = (text: string): Set<string> => new Set([...text.matchAll(/(?<![\w-])--([a-z][a-z-]*)/g)].map((m) => m[1] as string));
  const help = flags(Object.values(helpTexts(UPSTREAMS)).join('\n'));
  const docs = flags(read('docs/cli.md'));
  assert.ok(help.has('alert-at') && help.size > 10);
  assert.deepEqual(
    [...help].filter((f) => !docs.has(f)),
    [],
    'in a help text, not in docs/cli.md',
  );
  assert.deepEqual(
    [...docs].filter((f) => !help.has(f)),
    [],
    'in docs/cli.md, in no help text',
  );
});

test("ARCHITECTURE.md's module table names every module under src/, and no other", () => {
  const section = read('ARCHITECTURE.md').split('## Modules')[1]?.split('\n## ')[0] ?? '';
  const listed = new Set(
    [...section.matchAll(/^\| (`[^|]*) \|/gm)].flatMap((m) => [...(m[1] as string).matchAll(/`([a-z0-9/.-]+\.ts)`/g)].map((x) => x[1] as string)),
  );
  const tree = new Set(
    (readdirSync(new URL('../../src', import.meta.url), { recursive: true }) as string[]).filter((f) => f.endsWith('.ts')).map((f) => f.split(sep).join('/')),
  );
  assert.ok(tree.size > 60);
  assert.deepEqual([...tree].filter((f) => !listed.has(f)).sort(), [], 'in src/, not in the table');
  assert.deepEqual([...listed].filter((f) => !tree.has(f)).sort(), [], 'in the table, not in src/');
  // The top level holds only entry points.
  assert.deepEqual([...tree].filter((f) => !f.includes('/')).sort(), ['cli.ts', 'main.ts']);
});

test('every table row in the docs and the README ends its row: no row runs into the next paragraph', () => {
  const files = [
    'README.md',
    'ARCHITECTURE.md',
    ...readdirSync(new URL('../../docs/', import.meta.url))
      .filter((f) => f.endsWith('.md'))
      .map((f) => `docs/${f}`),
  ];
  const bad: string[] = [];
  for (const f of files) {
    read(f)
      .split('\n')
      .forEach((l, i) => {
        if (l.startsWith('|') && !l.trimEnd().endsWith('|')) bad.push(`${f}:${i + 1}`);
      });
  }
  assert.deepEqual(bad, []);
});

test("docs/limits.md's word on 429 headers in its walk-through is its table's: a budget refusal carries no RateLimit-Limit or -Remaining", () => {
  const readme = read('docs/limits.md');
  assert.doesNotMatch(readme, /`RateLimit-Limit`\/`-Remaining`\/`-Reset`/);
  const sentence = readme.slice(readme.indexOf('A request over a limit gets 429'), readme.indexOf('neither forwarded nor counted'));
  assert.match(sentence, /budget is money or characters, not a count of\s+requests/);
  assert.match(read('docs/limits.md'), /^\| budget \| — \(money or characters, no count of requests\) \| — \| — \| until the period ends \|$/m);
});
