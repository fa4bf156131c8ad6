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

/**
 * A name as the most lenient common parser reads it: `+` as a space,
 * percent-decoded, cut at a NUL (PHP registers `token%00` as `token`),
 * blanks and control characters trimmed at both ends (PHP drops leading
 * spaces: `+token`), without a `[...]` suffix, case-folded (ASP.NET's query
 * keys ignore case).
 */
function lenientName(raw: string): string {
  let name = raw.indexOf('+') >= 0 ? raw.replace(/\+/g, ' ') : raw;
  if (name.indexOf('%') >= 0) {
    name = name.replace(/%([0-9a-f]{2})/gi, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)));
  }
  const nul = name.indexOf('\0');
  if (nul >= 0) name = name.slice(0, nul);
  const bracket = name.indexOf('[');
  if (bracket > 0) name = name.slice(0, bracket);
  // Blanks and control characters (at or below U+0020, and U+007F) at either end.
  const blank = (c: number): boolean => c <= 0x20 || c === 0x7f;
  let a = 0;
  let b = name.length;
  while (a < b && blank(name.charCodeAt(a))) a++;
  while (b > a && blank(name.charCodeAt(b - 1))) b--;
  return name.slice(a, b).toLowerCase();
}

/**
 * True when some parameter could be read as one in `names` by a lenient
 * parser but is not one by the rules above (docs/routes.md, "Spellings an
 * upstream could read as its credential"): `token%00=`, `+token=`,
 * `token%20=`, and `;token=` (Rack before 3 and Python before 3.9.2 split
 * queries on `;` too). Such a request is refused rather than rewritten.
 */
export function hasLookalike(query: string, names: ReadonlySet<string>): boolean {
  if (names.size === 0 || query.length === 0) return false;
  for (const part of query.split(/[&;]/)) {
    const eq = part.indexOf('=');
    if (names.has(lenientName(eq < 0 ? part : part.slice(0, eq)))) return true;
  }
  return false;
}

/** A dollar figure for a query: at most six decimals, rounded down (a cap never rounds up), no exponent. */
export function usd(value: number): string {
  const micro = Math.floor(Math.max(0, value) * 1e6 + 1e-6);
  const whole = Math.floor(micro / 1e6);
  const frac = String(micro % 1e6)
    .padStart(6, '0')
    .replace(/0+$/, '');
  return frac === '' ? String(whole) : `${whole}.${frac}`;
}

const PLAIN_DECIMAL = /^\d{1,15}(?:\.\d{1,15})?$/;

/** The scraper platform's cap on what a run may cost, in US dollars (docs/routes.md, "Capped runs"). */
export const RUN_CAP = 'maxTotalChargeUsd';
const RUN_CAP_LENIENT = RUN_CAP.toLowerCase();

/** True when a lenient parser could read this `&`-part (or one of its `;`-parts) as the run cap. */
function readsAsRunCap(part: string): boolean {
  for (const sub of part.split(';')) {
    const eq = sub.indexOf('=');
    if (lenientName(eq < 0 ? sub : sub.slice(0, eq)) === RUN_CAP_LENIENT) return true;
  }
  return false;
}

/**
 * The client's own run cap: one parameter spelt exactly `maxTotalChargeUsd`
 * with a plain decimal value, and nothing else any parser could read as it
 * (a repeat, `maxTotalChargeUsd[]`, another case, an encoding); else null.
 */
export function askedRunCap(query: string): number | null {
  if (query.length === 0) return null;
  let asked: number | null = null;
  let seen = 0;
  for (const part of query.split('&')) {
    if (!readsAsRunCap(part)) continue;
    seen++;
    const eq = part.indexOf('=');
    const value = part.slice(eq + 1);
    if (eq === RUN_CAP.length && part.startsWith(RUN_CAP) && PLAIN_DECIMAL.test(value)) asked = Number(value);
  }
  return seen === 1 ? asked : null;
}

/**
 * `query` with the run capped at `cap` (docs/routes.md, "Capped runs"):
 * kept byte for byte when the client's own plain value is no larger;
 * otherwise every spelling of the parameter is removed whole and
 * `maxTotalChargeUsd=cap` appended at the end. Nothing else changes.
 */
export function withRunCap(query: string, cap: number): string {
  const asked = askedRunCap(query);
  if (asked !== null && asked <= cap) return query;
  const kept = query === '' ? [] : query.split('&').filter((p) => !readsAsRunCap(p));
  kept.push(`${RUN_CAP}=${usd(cap)}`);
  return kept.join('&');
}
