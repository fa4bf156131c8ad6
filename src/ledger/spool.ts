// Usage a drain could not write (docs/fleet.md, "Usage during an outage"):
// kept in a file beside the keys file, one per gateway process
// (`keys.json.usage-unwritten.<gateway>.json`, mode 0600), and written by
// the next gateway that starts there. Each batch keeps the id and number it
// was made with, so a batch that did reach the store before the drain gave
// up on it is skipped there, not counted twice.
import { readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { PendingRun } from './runs.ts';
import type { BatchId, UsageRow } from './store.ts';

export interface Batch extends BatchId {
  readonly rows: readonly UsageRow[];
  /** Scraper runs started in this batch's requests, settled later (runs.ts). */
  readonly runs?: readonly PendingRun[];
}

/** The spool's prefix for a keys file: `keys.json` → `keys.json.usage-unwritten`. */
export const spoolPrefix = (keysFile: string): string => `${keysFile}.usage-unwritten`;

const fileOf = (prefix: string, gateway: string): string => `${prefix}.${gateway.replace(/[^A-Za-z0-9_-]/g, '_')}.json`;

const COUNTS = ['requests', 's2xx', 's3xx', 's4xx', 's5xx', 'other', 'limited', 'bytesIn', 'bytesOut'] as const;
/** No call costs more than this in any unit a route reports (US dollars, characters): a larger figure is damage. */
const MOST_COST = 1e12;

/** Whether `route`/`keyId` are ones this gateway knows (its routes, its keys): a reason, or null. */
export type Known = (keyId: string | null, route: string) => string | null;

/**
 * Why a spooled row cannot be written, or null: the same rules as the
 * stores' (a UTC day that exists, counts that are whole and not negative
 * and fit a bigint, a finite cost that is not negative), and a key and route
 * this gateway knows. A row that fails them was written by hand or damaged;
 * sent to the store it failed there for ever (a day of 9999-99-99, a count
 * of 1e300) or was counted as it was (a cost of -1e300).
 */
export function rowProblem(r: unknown, known: Known): string | null {
  if (typeof r !== 'object' || r === null) return 'not a row';
  const o = r as Record<string, unknown>;
  if (typeof o.keyId !== 'string' || typeof o.route !== 'string') return 'no key or route';
  if (typeof o.day !== 'string' || !/^\d{4}-\d{2}-\d{2}$/.test(o.day)) return `day ${String(o.day)} is not YYYY-MM-DD`;
  const t = Date.parse(`${o.day}T00:00:00Z`);
  if (!Number.isFinite(t) || new Date(t).toISOString().slice(0, 10) !== o.day || o.day < '1970-01-01') return `day ${o.day} does not exist`;
  for (const k of COUNTS) if (!Number.isSafeInteger(o[k]) || (o[k] as number) < 0) return `${k} ${String(o[k])} is not a whole number from 0 to 2^53`;
  if (typeof o.cost !== 'number' || !Number.isFinite(o.cost) || o.cost < 0 || o.cost > MOST_COST)
    return `cost ${String(o.cost)} is not a figure from 0 to ${MOST_COST}`;
  return known(o.keyId, o.route);
}

/** Why a spooled batch cannot be written, or null. */
function batchProblem(b: unknown, known: Known): string | null {
  if (typeof b !== 'object' || b === null) return 'not a batch';
  const o = b as Record<string, unknown>;
  if (typeof o.gateway !== 'string' || !Number.isSafeInteger(o.seq) || !Array.isArray(o.rows)) return 'no gateway, number or rows';
  for (const r of o.rows) {
    const p = rowProblem(r, known);
    if (p !== null) return p;
  }
  if (o.credentials !== undefined) {
    if (!Array.isArray(o.credentials)) return 'credentials is not a list';
    for (const r of o.credentials) {
      const p = credentialProblem(r, known);
      if (p !== null) return p;
    }
  }
  if (o.runs !== undefined) {
    if (!Array.isArray(o.runs)) return 'runs is not a list';
    for (const r of o.runs) {
      const p = runProblem(r, known);
      if (p !== null) return p;
    }
  }
  return null;
}

/** Why a spooled credential row cannot be written, or null: the row rules (no key of its own) and a credential number from 1 to 32. */
function credentialProblem(r: unknown, known: Known): string | null {
  if (typeof r !== 'object' || r === null) return 'not a credential row';
  const o = r as Record<string, unknown>;
  if (!Number.isSafeInteger(o.credential) || (o.credential as number) < 1 || (o.credential as number) > 32)
    return `credential ${JSON.stringify(o.credential)} is not a number from 1 to 32`;
  const asRow = { ...o, keyId: '', limited: 0, bytesIn: 0, bytesOut: 0 };
  return rowProblem(asRow, (_key, route) => known(null, route));
}

/** Why a spooled pending run cannot be recorded, or null: the row rules for its day, key and route, a run id, what was booked, the path asked. */
function runProblem(r: unknown, known: Known): string | null {
  if (typeof r !== 'object' || r === null) return 'not a run';
  const o = r as Record<string, unknown>;
  if (typeof o.id !== 'string' || !/^[A-Za-z0-9_-]{1,64}$/.test(o.id)) return 'a run without a run id';
  if (typeof o.path !== 'string' || !o.path.startsWith('/') || o.path.length > 2048) return `run ${o.id}: no path to ask`;
  if (!Number.isSafeInteger(o.at) || (o.at as number) < 0) return `run ${o.id}: no start time`;
  if (o.credential !== undefined && (!Number.isSafeInteger(o.credential) || (o.credential as number) < 1 || (o.credential as number) > 32))
    return `run ${o.id}: credential ${JSON.stringify(o.credential)} is not a number from 1 to 32`;
  if (typeof o.booked !== 'number' || !Number.isFinite(o.booked) || o.booked < 0 || o.booked > MOST_COST)
    return `run ${o.id}: booked ${String(o.booked)} is not a figure from 0 to ${MOST_COST}`;
  return rowProblem({ ...o, requests: 0, s2xx: 0, s3xx: 0, s4xx: 0, s5xx: 0, other: 0, limited: 0, bytesIn: 0, bytesOut: 0, cost: o.booked }, known);
}

export interface SetAside {
  /** The file the batches were set aside to (beside the spool, never read again by a gateway). */
  readonly file: string;
  readonly batches: number;
  readonly reasons: readonly string[];
}

/**
 * Every batch kept under `prefix`, oldest file first, with the files they
 * came from; a file that is not one of ours (or damaged) is left where it is
 * and named in `bad`. A batch that fails the stores' rules is set aside
 * (written to `<file>.set-aside`, with why) and never blocks the others.
 */
export function readSpool(prefix: string, known: Known = () => null): { batches: Batch[]; files: string[]; bad: string[]; setAside: SetAside[] } {
  const dir = dirname(prefix);
  const start = `${basename(prefix)}.`;
  let names: string[];
  try {
    names = readdirSync(dir).filter((n) => n.startsWith(start) && n.endsWith('.json'));
  } catch {
    return { batches: [], files: [], bad: [], setAside: [] };
  }
  const batches: Batch[] = [];
  const files: string[] = [];
  const bad: string[] = [];
  const setAside: SetAside[] = [];
  for (const name of names.sort()) {
    const file = join(dir, name);
    let kept: unknown;
    try {
      kept = (JSON.parse(readFileSync(file, 'utf8')) as { batches?: unknown }).batches;
    } catch {
      bad.push(file);
      continue;
    }
    if (!Array.isArray(kept)) {
      bad.push(file);
      continue;
    }
    const aside: Array<{ batch: unknown; reason: string }> = [];
    for (const b of kept) {
      const reason = batchProblem(b, known);
      if (reason === null) batches.push(b as Batch);
      else aside.push({ batch: b, reason });
    }
    if (aside.length > 0) {
      const to = `${file}.set-aside`;
      writeFileSync(to, `${JSON.stringify({ setAside: aside })}\n`, { mode: 0o600 });
      setAside.push({ file: to, batches: aside.length, reasons: [...new Set(aside.map((a) => a.reason))] });
    }
    files.push(file);
  }
  return { batches, files, bad, setAside };
}

/**
 * Keep `batches` as this gateway's file (none: the file goes), then remove
 * the files they were read from: the new file is in place before an old one
 * is gone, so a crash between the two leaves a batch twice on disk (applied
 * once) rather than nowhere. Returns the file written, or null.
 */
export function writeSpool(prefix: string, gateway: string, batches: readonly Batch[], replaced: readonly string[]): string | null {
  const file = fileOf(prefix, gateway);
  let written: string | null = null;
  if (batches.length > 0) {
    const tmp = `${file}.tmp`;
    writeFileSync(tmp, `${JSON.stringify({ batches })}\n`, { mode: 0o600 });
    renameSync(tmp, file);
    written = file;
  }
  for (const old of replaced) if (old !== written) rmSync(old, { force: true });
  if (written === null) rmSync(file, { force: true });
  return written;
}
