// Which scraper-platform calls start paid work (docs/routes.md, "Paid
// starts"), read the way a lenient router upstream could read the path:
// percent-decoded, case-folded, `\` and `%2F` as separators, `;params` and
// trailing or doubled slashes ignored. A start missed here would run
// uncapped and unbooked, so every spelling the platform might accept counts.
// Pure.

/** What a call on the scraper route does with money. */
export type ScraperCall =
  /** Starts a run and answers with its run object: capped, recorded, settled. `prefix`: the upstream path its run is asked about under (`/v2`). */
  | { readonly kind: 'start'; readonly prefix: string }
  /** Starts a run and answers with its output (`run-sync…`): capped and booked at its cap, never settled. */
  | { readonly kind: 'sync' }
  /** Makes the platform start paid work later, out of the gateway's sight (schedules, webhooks, builds). */
  | { readonly kind: 'later' }
  /** Starts nothing. */
  | null;

const STARTED_UNDER = new Set(['acts', 'actor-tasks']);
const SYNC = new Set(['run-sync', 'run-sync-get-dataset-items']);
/** Endpoints that set an existing run going again; each answers with the run object. */
const AGAIN = new Set(['resurrect', 'reboot', 'metamorph']);
/** Resources whose creation or change makes the platform spend later. */
const LATER = new Set(['schedules', 'webhooks', 'builds']);
const WRITES = new Set(['POST', 'PUT', 'PATCH']);
/** Segments followed by an id. */
const ID_UNDER = new Set(['acts', 'actor-tasks', 'actor-runs', 'schedules', 'webhooks', 'actor-builds']);

/** `%XX` decoded where it is a byte; anything else kept as it is. */
function decoded(path: string): string {
  if (path.indexOf('%') < 0) return path;
  return path.replace(/%([0-9a-f]{2})/gi, (_, hex: string) => String.fromCharCode(parseInt(hex, 16)));
}

/** A path with nothing to decode or fold: its segments are its `/`-separated parts. */
const PLAIN = /^(?:\/[A-Za-z0-9._~!$&'()*+,=:@-]+)+\/?$/;

/** The path's segments as a lenient router reads them, in their own case; empty ones dropped. */
export function segmentsOf(path: string): string[] {
  if (PLAIN.test(path)) return path.split('/').filter((s) => s.length > 0);
  return decoded(path)
    .split(/[/\\]/)
    .map((s) => {
      const semi = s.indexOf(';');
      return semi < 0 ? s : s.slice(0, semi);
    })
    .filter((s) => s.length > 0);
}

/** What `method path` (below the route's prefix) does with money on the scraper platform. */
export function scraperCall(method: string, path: string): ScraperCall {
  const m = method.toUpperCase();
  if (!WRITES.has(m)) return null;
  const segs = segmentsOf(path);
  const lower = segs.map((s) => s.toLowerCase());
  // A resource name, not an id that happens to spell one (`acts/builds/runs`).
  if (lower.some((s, i) => LATER.has(s) && !ID_UNDER.has(lower[i - 1] ?? ''))) return { kind: 'later' };
  if (m !== 'POST') return null;
  const n = lower.length;
  const last = lower[n - 1] ?? '';
  const under = lower[n - 3];
  if (under !== undefined && STARTED_UNDER.has(under)) {
    if (last === 'runs') return { kind: 'start', prefix: prefixOf(segs, n - 3) };
    if (SYNC.has(last)) return { kind: 'sync' };
  }
  if (AGAIN.has(last)) {
    // `…/actor-runs/{id}/resurrect`, or the older `…/acts/{a}/runs/{id}/resurrect`.
    const at = lower.findIndex((s) => s === 'actor-runs' || STARTED_UNDER.has(s));
    return { kind: 'start', prefix: prefixOf(segs, at < 0 ? 0 : at) };
  }
  return null;
}

const prefixOf = (segs: readonly string[], end: number): string => (end <= 0 ? '' : `/${segs.slice(0, end).join('/')}`);
