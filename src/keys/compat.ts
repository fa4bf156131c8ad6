// Keys written for an older keyward (docs/keys.md, "Rolling back to 0.1.0").
// From 0.2.0 on every version reads what a later one writes: a key whose
// rules it cannot enforce is refused alone (503 key_unsupported). Builds of
// 0.1.0 from before that rule refuse a whole keys file holding a limit they
// do not know ("keys[0].limits.allowFrom is not a limit") and serve a key
// that `requires` a newer reader as if it required nothing. `keys export
// --for 0.1.0` writes a file such a build reads: limits it does not know
// are dropped, and a key that held one is written revoked (refused, never
// opened without its rule), each said on stderr. Pure.
import type { KeyRecord } from './keyset.ts';

/** What an older release reads of a key record. */
interface Release {
  /** The limits it enforces; any other makes it refuse the whole file. */
  readonly limits: ReadonlySet<string>;
}

/** The releases a keys file can be written for, by the version `keyward --version` printed. */
export const RELEASES: Readonly<Record<string, Release>> = {
  '0.1.0': { limits: new Set(['rate', 'burst', 'concurrency', 'quota', 'budgets', 'alerts']) },
};

/** A key the export refused for `release`: written revoked, and why. */
export interface Refused {
  readonly id: string;
  readonly name: string;
  readonly dropped: readonly string[];
}

/**
 * `records` as `release` must read them: unknown limits dropped from every
 * key (revoked ones too: one would make it refuse the file), and every
 * active key that lost a rule, or `requires` a newer record format, written
 * revoked at `now`.
 */
export function forRelease(records: readonly KeyRecord[], release: Release, now: number): { records: KeyRecord[]; refused: Refused[] } {
  const refused: Refused[] = [];
  const out = records.map((r) => {
    const dropped = Object.keys(r.limits ?? {}).filter((k) => !release.limits.has(k));
    const requires = (r as { requires?: unknown }).requires;
    const needsNewer = requires !== undefined && requires !== 1;
    if (dropped.length === 0 && !needsNewer) return r;
    const next: Record<string, unknown> = { ...r };
    delete next.requires;
    if (dropped.length > 0) {
      const limits: Record<string, unknown> = { ...r.limits };
      for (const k of dropped) delete limits[k];
      if (Object.keys(limits).length === 0) delete next.limits;
      else next.limits = limits;
    }
    if (r.revoked === null) {
      next.revoked = new Date(now).toISOString();
      next.previous = [];
      refused.push({ id: r.id, name: r.name, dropped: needsNewer ? [...dropped, `requires ${JSON.stringify(requires)}`] : dropped });
    }
    return next as unknown as KeyRecord;
  });
  return { records: out, refused };
}
