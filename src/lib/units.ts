// Durations and sizes as operators write them (`30s`, `2GiB`). Pure.

const DURATION_UNITS: Readonly<Record<string, number>> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const SIZE_UNITS: Readonly<Record<string, number>> = {
  b: 1,
  kb: 1e3,
  mb: 1e6,
  gb: 1e9,
  kib: 1024,
  mib: 1024 ** 2,
  gib: 1024 ** 3,
};

/** `1500ms`, `30s`, `5m`, `2h`, `30d` → milliseconds; a unit is required. `null` when unreadable. */
export function parseDuration(text: string): number | null {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$/i.exec(text);
  if (m === null) return null;
  const ms = Number(m[1]) * (DURATION_UNITS[(m[2] as string).toLowerCase()] as number);
  return Number.isSafeInteger(Math.round(ms)) ? Math.round(ms) : null;
}

/** `512KiB`, `2GiB`, `1000000B` → bytes; a unit is required. `null` when unreadable. */
export function parseSize(text: string): number | null {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb|kib|mib|gib)\s*$/i.exec(text);
  if (m === null) return null;
  const bytes = Math.floor(Number(m[1]) * (SIZE_UNITS[(m[2] as string).toLowerCase()] as number));
  return Number.isSafeInteger(bytes) ? bytes : null;
}
