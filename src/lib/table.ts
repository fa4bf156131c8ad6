// What the commands print for a terminal (docs/cli.md): aligned tables and
// CSV, with every character that could steer a terminal shown as an escape.
// A key's name can be set by SQL behind keyward's back, and a name holding
// `ESC ]0;…BEL` or `ESC [31m` would retitle or recolour the operator's
// terminal, and `\r\n` forge a row (ECMA-48 control functions; the bidi
// overrides of CVE-2021-42574 reorder what is shown). JSON output escapes
// them itself. Pure.

/** C0 and C1 controls, DEL, the line and paragraph separators and the bidi embeddings, overrides and isolates. */
// eslint-disable-next-line no-control-regex -- matching control characters is the point
const UNPRINTABLE = /[\u0000-\u001f\u007f-\u009f\u2028\u2029\u202a-\u202e\u2066-\u2069]/g;

/** `text` with each character that could steer a terminal written as an escape: `\x1b`, `\u202e`. */
export function printable(text: string): string {
  return text.replace(UNPRINTABLE, (c) => {
    const code = c.charCodeAt(0);
    return code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`;
  });
}

/** Rows as aligned columns, two spaces apart, each cell printable. */
export function table(rows: ReadonlyArray<readonly string[]>): string[] {
  const cells = rows.map((row) => row.map(printable));
  const widths = (cells[0] ?? []).map((_, c) => Math.max(...cells.map((row) => (row[c] ?? '').length)));
  return cells.map((row) =>
    row
      .map((cell, c) => cell.padEnd(widths[c] ?? 0))
      .join('  ')
      .trimEnd(),
  );
}

/** Rows as CSV (RFC 4180 quoting), each cell printable. */
export function csv(rows: ReadonlyArray<readonly string[]>): string[] {
  return rows.map((row) =>
    row
      .map(printable)
      .map((c) => (/[",]/.test(c) ? `"${c.replace(/"/g, '""')}"` : c))
      .join(','),
  );
}
