// Usage a drain could not write (docs/fleet.md, "Usage during an outage"):
// kept in a file beside the keys file, one per gateway process
// (`keys.json.usage-unwritten.<gateway>.json`, mode 0600), and written by
// the next gateway that starts there. Each batch keeps the id and number it
// was made with, so a batch that did reach the store before the drain gave
// up on it is skipped there, not counted twice.
import { readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import type { BatchId, UsageRow } from './ledger.ts';

export interface Batch extends BatchId {
  readonly rows: readonly UsageRow[];
}

/** The spool's prefix for a keys file: `keys.json` → `keys.json.usage-unwritten`. */
export const spoolPrefix = (keysFile: string): string => `${keysFile}.usage-unwritten`;

const fileOf = (prefix: string, gateway: string): string => `${prefix}.${gateway.replace(/[^A-Za-z0-9_-]/g, '_')}.json`;

const NUMBERS = ['requests', 's2xx', 's3xx', 's4xx', 's5xx', 'other', 'limited', 'bytesIn', 'bytesOut', 'cost'] as const;

function isRow(r: unknown): r is UsageRow {
  if (typeof r !== 'object' || r === null) return false;
  const o = r as Record<string, unknown>;
  return typeof o.keyId === 'string' && typeof o.route === 'string' && typeof o.day === 'string' && /^\d{4}-\d{2}-\d{2}$/.test(o.day) && NUMBERS.every((k) => typeof o[k] === 'number' && Number.isFinite(o[k]));
}

function isBatch(b: unknown): b is Batch {
  if (typeof b !== 'object' || b === null) return false;
  const o = b as Record<string, unknown>;
  return typeof o.gateway === 'string' && Number.isSafeInteger(o.seq) && Array.isArray(o.rows) && o.rows.every(isRow);
}

/**
 * Every batch kept under `prefix`, oldest file first, with the files they
 * came from; a file that is not one of ours (or damaged) is left where it is
 * and named in `bad`.
 */
export function readSpool(prefix: string): { batches: Batch[]; files: string[]; bad: string[] } {
  const dir = dirname(prefix);
  const start = `${basename(prefix)}.`;
  let names: string[];
  try {
    names = readdirSync(dir).filter((n) => n.startsWith(start) && n.endsWith('.json'));
  } catch {
    return { batches: [], files: [], bad: [] };
  }
  const batches: Batch[] = [];
  const files: string[] = [];
  const bad: string[] = [];
  for (const name of names.sort()) {
    const file = join(dir, name);
    try {
      const kept = (JSON.parse(readFileSync(file, 'utf8')) as { batches?: unknown }).batches;
      if (!Array.isArray(kept) || !kept.every(isBatch)) throw new Error('not a usage spool');
      batches.push(...kept);
      files.push(file);
    } catch {
      bad.push(file);
    }
  }
  return { batches, files, bad };
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
