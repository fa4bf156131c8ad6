// Small statistics shared by the bench's reports: medians, the spread over
// rounds, and each round's order of systems.

export const median = (xs: readonly number[]): number | null => {
  if (xs.length === 0) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)] as number;
};

/** Half the range over rounds, as a fraction of the median: how far one round strays. */
export function spreadOf(xs: readonly number[]): number | undefined {
  const m = median(xs);
  if (xs.length < 2 || m === null || m === 0) return undefined;
  return (Math.max(...xs) - Math.min(...xs)) / 2 / m;
}

/**
 * The systems' order for one round: a Fisher–Yates shuffle driven by a
 * small generator seeded with the round (mulberry32), so a run can be
 * repeated in the same orders and every system follows each other one
 * about as often.
 */
export function roundOrder(n: number, round: number): number[] {
  let seed = (round + 1) * 0x9e3779b1;
  const next = (): number => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const order = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(next() * (i + 1));
    [order[i], order[j]] = [order[j] as number, order[i] as number];
  }
  return order;
}

export const fmt = (x: number | null | undefined, digits = 1): string => (x === null || x === undefined || Number.isNaN(x) ? '—' : x.toFixed(digits));
export const pct = (x: number | undefined): string => (x === undefined ? '' : ` ±${Math.round(x * 100)}%`);
export const range = (xs: readonly number[], digits = 2): string => (xs.length < 2 ? '' : `${fmt(Math.min(...xs), digits)}–${fmt(Math.max(...xs), digits)}`);
