// Several credentials on one route (docs/credentials.md): which one a request
// gets, which are set aside after the upstream refused them, and when they
// come back. The board is the gateway's, kept across reloads; what it knows
// is shared with the other workers and gateways (process/credential-share.ts)
// as absolute instants, so a credential comes back at the same moment on all.
// Pure but for the clock passed in.
import type { Credential, Route } from './routes.ts';

/** The upstream statuses that set a credential aside (docs/credentials.md, "Set aside"). */
export type AsideStatus = 401 | 402 | 429;

/** A credential set aside: until an instant (epoch ms), or for good until a reload (401: Infinity). */
export interface Aside {
  readonly route: string;
  readonly label: number;
  readonly status: AsideStatus;
  readonly until: number;
}

export interface CredentialSettings {
  readonly credentialOrder: 'spread' | 'first';
  readonly credentialCooldownMs: number;
  readonly credentialPaymentCooldownMs: number;
}

/** The longest an upstream's Retry-After may set a credential aside: a broken or hostile header must not shelve an account for good. */
export const RETRY_AFTER_MAX_MS = 24 * 3_600_000;

export function isAsideStatus(status: number | undefined): status is AsideStatus {
  return status === 429 || status === 402 || status === 401;
}

/**
 * Until when an answer of `status` sets its credential aside: 401 for good
 * (until a reload), 402 for the payment cooldown, 429 for its Retry-After
 * (seconds or an HTTP date, RFC 9110 §10.2.3; at least a second, at most
 * RETRY_AFTER_MAX_MS), else the cooldown.
 */
export function asideUntil(status: AsideStatus, retryAfter: string | undefined, now: number, s: CredentialSettings): number {
  if (status === 401) return Infinity;
  if (status === 402) return now + s.credentialPaymentCooldownMs;
  const text = retryAfter?.trim() ?? '';
  let ms = NaN;
  if (/^\d{1,10}$/.test(text)) ms = Number(text) * 1000;
  else if (text !== '') ms = Date.parse(text) - now;
  if (!Number.isFinite(ms) || ms <= 0) ms = s.credentialCooldownMs;
  return now + Math.min(Math.max(ms, 1000), RETRY_AFTER_MAX_MS);
}

/** A request sent again: credential `from` answered `status`, and the request went to `to`. */
export interface Retry {
  readonly route: Route;
  readonly status: AsideStatus;
  readonly from: number;
  readonly to: number;
}

const slot = (route: string, label: number): string => `${route}\u0000${label}`;

export class CredentialBoard {
  readonly #aside = new Map<string, Aside>();
  /** Requests in flight from this process, per route, by the credential's position. */
  readonly #inFlight = new Map<string, number[]>();
  /** Where the next tie breaks, per route (`spread`). */
  readonly #turn = new Map<string, number>();
  /** Told of every credential set aside here (`shared` false) or by a peer (true). */
  readonly #listeners: Array<(a: Aside, shared: boolean) => void> = [];

  /** Told of every request sent again on another credential after `status`. */
  readonly #retries: Array<(retry: Retry) => void> = [];

  onAside(listener: (a: Aside, shared: boolean) => void): void {
    this.#listeners.push(listener);
  }

  onRetry(listener: (retry: Retry) => void): void {
    this.#retries.push(listener);
  }

  retried(retry: Retry): void {
    for (const l of this.#retries) l(retry);
  }

  available(route: string, label: number, now: number): boolean {
    const a = this.#aside.get(slot(route, label));
    if (a === undefined) return true;
    if (a.until > now) return false;
    this.#aside.delete(slot(route, label));
    return true;
  }

  /**
   * The credential a request gets: the only one, or among those available
   * and not in `tried`, the lowest-numbered (`first`) or the one with the
   * fewest requests in flight here, ties in turn (`spread`); null when none.
   */
  choose(route: Route, order: CredentialSettings['credentialOrder'], tried: ReadonlySet<number> | null, now: number): Credential | null {
    const creds = route.credentials;
    if (creds.length === 1) return creds[0] as Credential;
    const loads = this.#loads(route);
    const start = order === 'first' ? 0 : (this.#turn.get(route.name) ?? 0);
    let best: Credential | null = null;
    let bestLoad = Infinity;
    for (let k = 0; k < creds.length; k++) {
      const i = (start + k) % creds.length;
      const c = creds[i] as Credential;
      if (tried?.has(c.label) === true || !this.available(route.name, c.label, now)) continue;
      if (order === 'first') return c;
      const load = loads[i] as number;
      if (load < bestLoad) {
        best = c;
        bestLoad = load;
      }
    }
    if (best !== null) this.#turn.set(route.name, best.label % creds.length);
    return best;
  }

  /** A request went out on `c` (a route with several credentials). */
  take(route: Route, c: Credential): void {
    (this.#loads(route)[c.label - 1] as number)++;
  }

  give(route: Route, c: Credential): void {
    const loads = this.#loads(route);
    if ((loads[c.label - 1] as number) > 0) (loads[c.label - 1] as number)--;
  }

  /** Set aside by an answer seen here; listeners are told (metrics, log, the peers). A later instant wins over an earlier one. */
  setAside(a: Aside): void {
    if (this.#record(a)) for (const l of this.#listeners) l(a, false);
  }

  /** Set aside by a peer (another worker or gateway): applied, never passed on again. */
  apply(a: Aside): void {
    if (this.#record(a)) for (const l of this.#listeners) l(a, true);
  }

  /** A reload: credentials refused with 401 come back (the configuration may hold a new secret). */
  reloaded(): void {
    for (const [k, a] of this.#aside) if (a.status === 401) this.#aside.delete(k);
  }

  /** How many of the route's credentials are available now. */
  availableCount(route: Route, now: number): number {
    let n = 0;
    for (const c of route.credentials) if (this.available(route.name, c.label, now)) n++;
    return n;
  }

  /** Seconds until the route's first credential set aside comes back; null when every one waits for a reload. */
  retryAfter(route: Route, now: number): number | null {
    let first = Infinity;
    for (const c of route.credentials) {
      const a = this.#aside.get(slot(route.name, c.label));
      if (a !== undefined && a.until < first) first = a.until;
    }
    return first === Infinity ? null : Math.max(1, Math.ceil((first - now) / 1000));
  }

  /** Every credential set aside now (shared with a peer that starts). */
  current(now: number): Aside[] {
    return [...this.#aside.values()].filter((a) => a.until > now);
  }

  #record(a: Aside): boolean {
    const k = slot(a.route, a.label);
    const had = this.#aside.get(k);
    if (had !== undefined && had.until >= a.until) return false;
    this.#aside.set(k, a);
    return true;
  }

  #loads(route: Route): number[] {
    let loads = this.#inFlight.get(route.name);
    if (loads === undefined || loads.length < route.credentials.length) {
      const grown = new Array<number>(route.credentials.length).fill(0);
      loads?.forEach((n, i) => (grown[i] = n));
      loads = grown;
      this.#inFlight.set(route.name, loads);
    }
    return loads;
  }
}
