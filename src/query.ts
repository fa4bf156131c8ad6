// Query-string surgery that keeps everything else byte for byte (docs/routes.md):
// parameters are only ever removed whole; nothing is decoded, re-encoded or
// reordered in what is forwarded. Names are compared the way an upstream's
// parser would see them: percent-decoded, case-folded, and without a
// `[...]` suffix (qs-style parsers read `token[]=x` as `token`).

function canonicalName(raw: string): string {
  let name = raw;
  if (name.indexOf('%') >= 0) {
    name = name.replace(/%([0-9a-f]{2})/gi, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)));
  }
  const bracket = name.indexOf('[');
  if (bracket > 0) name = name.slice(0, bracket);
  return name.toLowerCase();
}

function nameEnd(query: string, start: number, end: number): number {
  const eq = query.indexOf('=', start);
  return eq < 0 || eq > end ? end : eq;
}

/**
 * Remove every parameter whose canonical name is in `names`, however often and
 * with or without a value. Returns the input itself when nothing matches.
 */
export function dropParams(query: string, names: ReadonlySet<string>): string {
  if (names.size === 0 || query.length === 0) return query;
  const kept: string[] = [];
  let dropped = false;
  let start = 0;
  while (start <= query.length) {
    let end = query.indexOf('&', start);
    if (end < 0) end = query.length;
    if (names.has(canonicalName(query.slice(start, nameEnd(query, start, end))))) dropped = true;
    else kept.push(query.slice(start, end));
    start = end + 1;
  }
  return dropped ? kept.join('&') : query;
}

/** True when any parameter's canonical name is in `names`. */
export function hasParam(query: string, names: ReadonlySet<string>): boolean {
  if (names.size === 0 || query.length === 0) return false;
  let start = 0;
  while (start <= query.length) {
    let end = query.indexOf('&', start);
    if (end < 0) end = query.length;
    if (names.has(canonicalName(query.slice(start, nameEnd(query, start, end))))) return true;
    start = end + 1;
  }
  return false;
}

/** The raw value of the first parameter whose canonical name is `name` (percent-decoded), or null. */
export function paramValue(query: string, name: string): string | null {
  let start = 0;
  while (start < query.length) {
    let end = query.indexOf('&', start);
    if (end < 0) end = query.length;
    const eq = nameEnd(query, start, end);
    if (canonicalName(query.slice(start, eq)) === name) {
      const value = eq < end ? query.slice(eq + 1, end) : '';
      try {
        return value.indexOf('%') < 0 ? value : decodeURIComponent(value);
      } catch {
        return value;
      }
    }
    start = end + 1;
  }
  return null;
}
