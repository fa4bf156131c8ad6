// One check for a stored key, wherever it is read from: the keys file and
// the PostgreSQL table alike. A record that fails it never opens anything.
// What a failure means differs by store (docs/keys.md): a keys file is
// written whole by keyward, so a bad entry means a damaged file and the file
// is refused whole; a table row can be written by anyone with SQL, so a bad
// row is skipped alone and the rest of the set serves.
//
// Each version reads what the next one writes (docs/keys.md, "Versions"): a
// record that reads whole but for its rules (a limit this version does not
// know, a `requires` above the format it reads) is kept, marked unsupported,
// and refused alone with 503: never served without its rules, and its
// revocation and expiry still apply.
import { limitsProblem } from './limits.ts';
import { UNSUPPORTED, type KeyRecord } from './keyset.ts';

const isString = (v: unknown): v is string => typeof v === 'string';
export const isDate = (v: unknown): v is string => isString(v) && !Number.isNaN(Date.parse(v));
// Shape only: a digest that is not hex can never match a lookup.
const isDigest = (v: unknown): v is string => isString(v) && v.length === 71 && v.startsWith('sha256:');
// `created` is informational and present on every key: a shape check keeps a
// million-key file loading in well under a second (Date.parse would double it).
const ISO_INSTANT = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2})$/;

/** A key's external id (docs/admin-api.md): what a keys-as-code tool names it by. */
export const EXTERNAL_ID = /^[\x21-\x7e]{1,128}$/;

/** The record format this version reads: a key whose `requires` is higher was written for a newer keyward. */
export const RECORD_FORMAT = 1;

/**
 * A stored record as this version serves it: `problem` when its identity or
 * state cannot be read (it opens nothing); otherwise the record itself,
 * marked UNSUPPORTED when its rules cannot be read or enforced here (the
 * mark is a symbol on the object: the CLI writes the record back as it
 * was, unknown fields and all).
 */
export function readRecord(k: unknown, costRoutes: readonly string[]): { record: KeyRecord; problem: null } | { record: null; problem: string } {
  const problem = identityProblem(k);
  if (problem !== null) return { record: null, problem };
  const why = rulesProblem(k as Record<string, unknown>, costRoutes);
  if (why !== null) (k as { [UNSUPPORTED]?: string })[UNSUPPORTED] = why;
  return { record: k as KeyRecord, problem: null };
}

/**
 * What is wrong with `k` as a stored key, as the tail of a message
 * (`.digest must be …`), or null when it is a valid record. Shapes only: this
 * runs on every reload of a million keys. Unique ids are enforced where keys
 * are written, not here. `costRoutes`: the routes a budget may name (routes.ts).
 */
export function recordProblem(k: unknown, costRoutes: readonly string[]): string | null {
  return identityProblem(k) ?? rulesProblem(k as Record<string, unknown>, costRoutes);
}

/** What keeps `k` from naming a key, its state, its scope and its tokens: a damaged record, which opens nothing. */
function identityProblem(k: unknown): string | null {
  if (typeof k !== 'object' || k === null) return ' is not an object';
  const r = k as Record<string, unknown>;
  if (!isString(r.id) || r.id.length === 0) return '.id must be a non-empty string';
  if (!isString(r.name)) return '.name must be a string';
  if (!isDigest(r.digest)) return '.digest must be "sha256:" and 64 hex digits';
  if (!isString(r.created) || !ISO_INSTANT.test(r.created)) return '.created must be a date';
  if (r.expires !== null && !isDate(r.expires)) return '.expires must be a date or null';
  if (r.revoked !== null && !isDate(r.revoked)) return '.revoked must be a date or null';
  if (r.routes !== undefined && r.routes !== null && !(Array.isArray(r.routes) && r.routes.every(isString)))
    return '.routes must be a list of route names or null';
  if (r.externalId !== undefined && !(isString(r.externalId) && EXTERNAL_ID.test(r.externalId)))
    return '.externalId must be 1-128 printable characters without spaces';
  if (r.previous !== undefined) {
    if (!Array.isArray(r.previous)) return '.previous must be a list';
    for (const p of r.previous as unknown[]) {
      // A grace date that is not a date would otherwise keep an old token valid for ever.
      if (typeof p !== 'object' || p === null || !isDigest((p as Record<string, unknown>).digest) || !isDate((p as Record<string, unknown>).until)) {
        return '.previous entries must have a digest and an "until" date';
      }
    }
  }
  return null;
}

/**
 * What keeps this version from enforcing `r`'s rules: its limits, or a
 * record format above the one it reads. What a newer version adds to a key
 * lands here; a malformed scope or rotated-out token (identityProblem) is a
 * damaged record, not a newer one.
 */
function rulesProblem(r: Record<string, unknown>, costRoutes: readonly string[]): string | null {
  if (r.requires !== undefined) {
    if (!(Number.isInteger(r.requires) && (r.requires as number) >= 1)) return '.requires must be a whole number above 0';
    if ((r.requires as number) > RECORD_FORMAT) return `.requires is record format ${r.requires as number}; this keyward reads format ${RECORD_FORMAT}`;
  }
  return limitsProblem(r.limits, costRoutes);
}

/**
 * `records` split into those served (unsupported ones marked, readRecord)
 * and the problems of those that cannot be read, by id (or position when
 * the id is unusable).
 */
export function validRecords(records: readonly unknown[], costRoutes: readonly string[]): { valid: KeyRecord[]; invalid: Map<string, string> } {
  const valid: KeyRecord[] = [];
  const invalid = new Map<string, string>();
  for (let i = 0; i < records.length; i++) {
    const read = readRecord(records[i], costRoutes);
    if (read.record !== null) valid.push(read.record);
    else {
      const id = (records[i] as { id?: unknown } | null)?.id;
      invalid.set(typeof id === 'string' && id !== '' ? id : `#${i}`, read.problem);
    }
  }
  return { valid, invalid };
}
