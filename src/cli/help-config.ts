// `keyward help config`: every option with its default, unit and meaning,
// read from docs/configuration.md, which ships in the package and whose
// table a test holds to the options the configuration reads
// (test/unit/docs-match-code.test.ts): one table, so help and docs agree.
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const DOC = fileURLToPath(new URL('../../docs/configuration.md', import.meta.url));

/** A table row's cells, markdown's `code` marks and escapes taken off. */
const cells = (row: string): string[] =>
  row
    .slice(1, -1)
    .split(' | ')
    .map((c) => c.trim().replace(/`/g, '').replace(/\\\|/g, '|'));

/** The options table of `text` (docs/configuration.md), as plain text for a terminal: name, default and form, then the meaning indented. */
export function configHelp(text: string): string {
  const rows = text.split('\n').filter((l) => l.startsWith('| `KEYWARD_'));
  const out = [
    'Every option (environment variables, or NAME=value lines in KEYWARD_CONFIG_FILE).',
    'Secrets also read from NAME_FILE, or systemd LoadCredential=.',
    '',
  ];
  for (const row of rows) {
    const [name = '', fallback = '', form = '', meaning = ''] = cells(row);
    out.push(`${name}`, `    default: ${fallback}; ${form}`, `    ${meaning}`, '');
  }
  out.push('More in docs/configuration.md (installed with the package).', '');
  return out.join('\n');
}

/** The help text from the installed docs, or a line saying where they should have been. */
export function readConfigHelp(read: (path: string) => string = (p) => readFileSync(p, 'utf8')): string {
  try {
    return configHelp(read(DOC));
  } catch {
    return `keyward: ${DOC} is missing; the options are listed in docs/configuration.md of the keyward repository.\n`;
  }
}
