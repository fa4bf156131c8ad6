// The key set one gateway holds from the keys table (docs/fleet.md, "How a
// change travels"), and how it moves: built from every row after a
// (re)connect, moved forward by the rows and tombstones above the version
// held. Pure: the watch (pg-watch.ts) does the reading and decides when.
import type { KeyRecord } from './keyset.ts';
import { toRecord, type Row } from './pg-schema.ts';
import { readRecord } from './record.ts';

/** A row skipped as invalid: why, and its hash (it still counts in the table's checksum). */
export interface Skipped {
  readonly problem: string;
  readonly h: bigint;
}

/**
 * What is held: the valid records (creation order, new keys last), their
 * positions by id and row hashes by position, the rows skipped as invalid,
 * the highest version applied and the table's checksum at that version.
 */
export interface Held {
  readonly records: readonly KeyRecord[];
  readonly hashes: BigInt64Array;
  readonly index: Map<string, number>;
  readonly invalid: ReadonlyMap<string, Skipped>;
  readonly version: bigint;
  readonly sum: bigint;
}

/** A tombstone: the key `id` was deleted at `version`. */
export interface Tombstone {
  readonly id: string;
  readonly version: string;
}

export const NOTHING_HELD: Held = { records: [], hashes: new BigInt64Array(0), index: new Map(), invalid: new Map(), version: -1n, sum: 0n };

/** The whole table at version `top`, as read in one snapshot (rows with their hashes). */
export function heldFrom(rows: readonly Row[], top: bigint, costRoutes: readonly string[]): Held {
  const records: KeyRecord[] = [];
  const hashes = new BigInt64Array(rows.length);
  const index = new Map<string, number>();
  const invalid = new Map<string, Skipped>();
  let sum = 0n;
  for (const row of rows) {
    const rec = toRecord(row);
    const h = BigInt(row.h);
    sum += h;
    const problem = readRecord(rec, costRoutes).problem;
    if (problem !== null) invalid.set(row.id, { problem, h });
    else {
      hashes[records.length] = h;
      index.set(rec.id, records.length);
      records.push(rec);
    }
  }
  return { records, hashes, index, invalid, version: top, sum };
}

/** Rows and tombstones in version order: a key deleted and created again ends up present. */
function inOrder(rows: readonly Row[], dead: readonly Tombstone[]): Array<{ v: bigint; id: string; row: Row | null }> {
  const events = [...rows.map((row) => ({ v: BigInt(row.version), id: row.id, row })), ...dead.map((d) => ({ v: BigInt(d.version), id: d.id, row: null }))];
  return events.sort((a, b) => (a.v < b.v ? -1 : a.v > b.v ? 1 : 0));
}

/**
 * `held` moved forward by the rows changed and the keys deleted above its
 * version; `held` itself when there are none. Its index is changed in place
 * (copying a million entries per change would cost more than the change):
 * a caller that does not then put the result in force must rebuild from
 * scratch (the watch's `dirty`).
 */
export function heldAfter(held: Held, rows: readonly Row[], dead: readonly Tombstone[], costRoutes: readonly string[]): Held {
  if (rows.length === 0 && dead.length === 0) return held;
  const next: Array<KeyRecord | null> = held.records.slice();
  const hashes = new BigInt64Array(held.records.length + rows.length);
  hashes.set(held.hashes.subarray(0, held.records.length));
  const index = held.index;
  const invalid = new Map(held.invalid);
  let sum = held.sum;
  let removed = false;
  let top = held.version;
  for (const e of inOrder(rows, dead)) {
    if (e.v > top) top = e.v;
    const at = index.get(e.id);
    // The row's old hash leaves the sum; its new one (if it still exists) enters it.
    sum -= at !== undefined ? (hashes.at(at) ?? 0n) : (invalid.get(e.id)?.h ?? 0n);
    invalid.delete(e.id);
    const h = e.row === null ? 0n : BigInt(e.row.h);
    sum += h;
    const rec = e.row === null ? null : toRecord(e.row);
    const problem = rec === null ? null : readRecord(rec, costRoutes).problem;
    if (rec !== null && problem === null) {
      const to = at ?? next.length;
      if (at === undefined) index.set(e.id, to);
      next[to] = rec;
      hashes[to] = h;
      continue;
    }
    if (problem !== null) invalid.set(e.id, { problem, h });
    if (at !== undefined) {
      // Deleted, or changed into a row that fails the check: it opens nothing from now on.
      next[at] = null;
      index.delete(e.id);
      removed = true;
    }
  }
  const kept = removed ? compact(next, hashes, index) : { records: next as KeyRecord[], hashes };
  return { ...kept, index, invalid, version: top, sum };
}

/** The records left after removals, closed up, with their hashes and the index rebuilt. */
function compact(next: ReadonlyArray<KeyRecord | null>, hashes: BigInt64Array, index: Map<string, number>): { records: KeyRecord[]; hashes: BigInt64Array } {
  const records: KeyRecord[] = [];
  const keptHashes = new BigInt64Array(next.length);
  index.clear();
  next.forEach((r, i) => {
    if (r === null) return;
    keptHashes[records.length] = hashes.at(i) ?? 0n;
    index.set(r.id, records.length);
    records.push(r);
  });
  return { records, hashes: keptHashes };
}

/** Whether the set of invalid rows differs between two helds (by id). */
export function invalidChanged(before: Held, after: Held): boolean {
  return after.invalid.size !== before.invalid.size || [...after.invalid.keys()].some((id) => !before.invalid.has(id));
}
