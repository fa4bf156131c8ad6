// Variables named KEYWARD_* that no option reads (docs/configuration.md,
// "Names"): a typo such as KEYWARD_SCRAPER_KEY for KEYWARD_SCRAPER_TOKEN
// would otherwise switch a route off without a word. Each is reported with
// the known name closest to it. Pure.

/** Read by the launcher or by tests, not by the configuration. */
export const ELSEWHERE: ReadonlySet<string> = new Set([
  'KEYWARD_CONFIG_FILE',
  'KEYWARD_FROM_SOURCE',
  'KEYWARD_INHERITED_FD',
  'KEYWARD_NODE',
  'KEYWARD_STRICT_ENV',
  'KEYWARD_TEST_DATABASE_URL',
]);

export interface UnknownVariable {
  readonly name: string;
  /** The known name it most likely meant, or null when none is close. */
  readonly suggestion: string | null;
}

/** Edits (insert, delete, replace) between two strings. */
export function distance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++)
      row[j] = Math.min((prev[j] as number) + 1, (row[j - 1] as number) + 1, (prev[j - 1] as number) + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = row;
  }
  return prev[b.length] as number;
}

/** Last words people use for the same thing: any of them may stand for any other. */
const SAME: ReadonlyArray<ReadonlySet<string>> = [
  new Set(['KEY', 'TOKEN', 'SECRET', 'APIKEY', 'PASSWORD', 'PASS', 'LOGIN', 'USER', 'CREDENTIAL']),
  new Set(['PORT']),
  new Set(['HOST', 'ADDRESS', 'BIND', 'ADDR']),
  new Set(['URL', 'ENDPOINT', 'BASE', 'TARGET', 'UPSTREAM']),
  new Set(['TIMEOUT', 'TIMOUT', 'DEADLINE']),
];
const family = (word: string): ReadonlySet<string> | null => SAME.find((s) => s.has(word)) ?? null;
const words = (name: string): string[] => name.split('_').slice(1);

/**
 * The known name `name` most likely meant: one of the same provider (first
 * word) whose last word means the same (KEYWARD_SCRAPER_KEY →
 * KEYWARD_SCRAPER_TOKEN); else the closest in edits if close enough
 * (KEYWARD_DRAIN_TIMOUT); else the shortest whose last word means the same
 * (KEYWARD_LISTEN_PORT → KEYWARD_PORT).
 */
export function closest(name: string, known: readonly string[]): string | null {
  const w = words(name);
  const same = family(w[w.length - 1] ?? '');
  const byDistance = (list: readonly string[]): string | null => [...list].sort((a, b) => distance(name, a) - distance(name, b))[0] ?? null;
  const tailMatches = same === null ? [] : known.filter((k) => same.has(words(k).at(-1) ?? ''));
  const sameHead = tailMatches.filter((k) => words(k)[0] === w[0]);
  if (sameHead.length > 0) return byDistance(sameHead);
  const near = byDistance(known);
  if (near !== null && distance(name, near) <= Math.max(2, Math.floor(name.length / 6))) return near;
  if (tailMatches.length > 0) return [...tailMatches].sort((a, b) => words(a).length - words(b).length || distance(name, a) - distance(name, b))[0] as string;
  return near !== null && distance(name, near) <= Math.floor(name.length / 3) ? near : null;
}

/**
 * The word of `known` a mistyped `word` most likely meant (`crate` →
 * `create`), or null when none is close; `slack`: the edits allowed at
 * least (two lets a swap of two letters through: `nmae` → `name`).
 */
export function nearest(word: string, known: readonly string[], slack = 1): string | null {
  const best = [...known].sort((a, b) => distance(word, a) - distance(word, b))[0];
  return best !== undefined && distance(word, best) <= Math.max(slack, Math.floor(best.length / 3)) ? best : null;
}

/** The KEYWARD_* names in `env` that are not among `known` (every name the configuration read). */
export function unknownVariables(env: Readonly<Record<string, string | undefined>>, known: ReadonlySet<string>): UnknownVariable[] {
  const names = [...known].filter((k) => k.startsWith('KEYWARD_'));
  return Object.keys(env)
    .filter((k) => k.startsWith('KEYWARD_') && !known.has(k) && !ELSEWHERE.has(k))
    .sort()
    .map((name) => ({ name, suggestion: closest(name, names) }));
}
