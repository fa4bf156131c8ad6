// An admin token as stored (docs/admin-api.md, "Admin tokens"): its record
// and the check every store applies to it when reading. Pure.
import { isDate } from './record.ts';

export type AdminRole = 'read' | 'write';
export const ADMIN_ROLES: readonly AdminRole[] = ['read', 'write'];

export interface AdminRecord {
  readonly id: string;
  readonly name: string;
  /** `read` may only GET; `write` may change keys too. */
  readonly role: AdminRole;
  /** `sha256:` and the token's digest; the token itself is shown once. */
  readonly digest: string;
  readonly created: string;
  readonly revoked: string | null;
}

/** What is wrong with `a` as a stored admin record, as the tail of a message; null when it is one. */
export function adminProblem(a: unknown): string | null {
  if (typeof a !== 'object' || a === null) return ' is not an object';
  const r = a as Record<string, unknown>;
  if (typeof r.id !== 'string' || r.id === '') return '.id must be a non-empty string';
  if (typeof r.name !== 'string') return '.name must be a string';
  if (!ADMIN_ROLES.includes(r.role as AdminRole)) return '.role must be read or write';
  if (typeof r.digest !== 'string' || !/^sha256:[0-9a-f]{64}$/.test(r.digest)) return '.digest must be "sha256:" and 64 hex digits';
  if (!isDate(r.created)) return '.created must be a date';
  if (r.revoked !== null && !isDate(r.revoked)) return '.revoked must be a date or null';
  return null;
}
