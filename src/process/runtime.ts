// One configuration generation (docs/configuration.md): what the request
// path reads (request/runtime.ts), built once from a frozen Config and
// swapped whole on reload, and what a reload can and cannot change.
import type { Config } from '../config/load.ts';
import { secretsByOrigin, type Secrets } from '../request/egress.ts';
import type { CredentialBoard } from '../request/credentials.ts';
import { Forwarder } from '../request/forward.ts';
import type { Room } from '../capacity/capacity.ts';
import { rangeSet } from '../lib/addresses.ts';
import { routeTable } from '../request/routes.ts';
import type { Generation, Target } from '../request/runtime.ts';

/** Swapped whole on reload; a request keeps the one it started under. */
export interface Runtime extends Generation {
  readonly config: Config;
  readonly forwarders: ReadonlyMap<string, Forwarder>;
}

/** `board`: the gateway's credentials set aside, `room`: room on the accounts (both kept across generations). */
export function buildRuntime(config: Config, board: CredentialBoard, room: Room): Runtime {
  // Each answer is scanned for every secret sent to its upstream's origin, every credential's (egress.ts).
  const tables = secretsByOrigin(config.routes, config.egressFilter);
  const forwarders = new Map(config.routes.map((r) => [r.name, new Forwarder(r, config, tables.get(r.target.origin) as Secrets, board, room)]));
  const targets = new Map<string, Target>();
  for (const r of config.routes) {
    const forwarder = forwarders.get(r.name);
    if (r.credential !== null && forwarder !== undefined) targets.set(r.name, { forwarder });
  }
  return { config, table: routeTable(config.routes), forwarders, targets, trustedProxies: rangeSet(config.trustedProxies) };
}

/**
 * The options a reload cannot apply, by the name users write them: changing
 * one needs a restart (the listening sockets, the worker processes and the
 * key store are made once). Every other option applies on SIGHUP.
 */
export const RESTART_ONLY: ReadonlyArray<readonly [string, (c: Config) => unknown]> = [
  ['KEYWARD_HOST', (c) => c.host],
  ['KEYWARD_PORT', (c) => c.port],
  ['KEYWARD_WORKERS', (c) => c.workers],
  ['KEYWARD_KEYS_FILE', (c) => c.keysFile],
  ['KEYWARD_DATABASE_URL', (c) => c.databaseUrl],
  ['KEYWARD_DATABASE_TIMEOUT', (c) => c.databaseTimeoutMs],
  ['KEYWARD_LEASE_TTL', (c) => c.leaseTtlMs],
  ['KEYWARD_ADMISSION_WAIT', (c) => c.admissionWaitMs],
  ['KEYWARD_MAX_HEADER_SIZE', (c) => c.maxHeaderBytes],
  ['KEYWARD_USAGE_FLUSH', (c) => c.usageFlushMs],
  ['KEYWARD_ADMIN_HOST', (c) => c.admin?.host ?? null],
  ['KEYWARD_ADMIN_PORT', (c) => c.admin?.port ?? null],
  // The alert webhook is set up with the usage part, once.
  ['KEYWARD_ALERT_WEBHOOK', (c) => c.alertWebhook],
  ['KEYWARD_ALERT_WEBHOOK_SECRET', (c) => c.alertWebhookSecret],
  ['KEYWARD_ALERT_WEBHOOK_RETRY', (c) => c.alertWebhookRetryMs],
  // Certificates are re-read; switching between HTTP and HTTPS is not.
  ['KEYWARD_TLS_CERT_FILE', (c) => c.tls === null],
];

/** The restart-only options whose value differs between two configurations. */
export function restartOnlyChanges(before: Config, after: Config): string[] {
  return RESTART_ONLY.filter(([, get]) => get(before) !== get(after)).map(([name]) => name);
}

/** Why a running gateway cannot serve anything yet (no route has its secret, or no key is active), or null. */
export function idleReason(config: Config, activeKeys: number): string | null {
  if (config.enabledRoutes.length === 0) {
    const names = config.routes.flatMap((r) => r.secretEnvs);
    return `no route is configured: set the upstream secrets (${names.join(', ')}, or their _FILE forms)`;
  }
  if (activeKeys === 0) return 'no active key: create one with keyward keys create --name NAME';
  return null;
}

/** Each configured route's cost unit (`usd`, `characters`), or null for a route that reports none. */
export function costUnits(config: Pick<Config, 'routes'>): (route: string) => string | null {
  const units = new Map(config.routes.map((r) => [r.name, r.cost?.unit ?? null]));
  return (route) => units.get(route) ?? null;
}
