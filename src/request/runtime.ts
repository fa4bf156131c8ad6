// One configuration generation (docs/configuration.md): what the request
// path reads, built once from a frozen Config and swapped whole on reload
// (process/server.ts swaps it; process/runtime.ts says what a reload cannot
// change).
import type { Config } from '../config/load.ts';
import { secretForms, Secrets } from './egress.ts';
import { Forwarder } from './forward.ts';
import { routeTable, type RouteTable } from './routes.ts';

/** Swapped whole on reload; a request keeps the one it started under. */
export interface Runtime {
  readonly config: Config;
  readonly table: RouteTable;
  readonly forwarders: ReadonlyMap<string, Forwarder>;
  /** Each configured route's credential and forwarder, typed for the request path; a route without its secrets has none. */
  readonly targets: ReadonlyMap<string, Target>;
}

/** Where an admitted request goes: the credential the route injects, and its forwarder. */
export interface Target {
  readonly credential: readonly [name: string, value: string];
  readonly forwarder: Forwarder;
}

export function buildRuntime(config: Config): Runtime {
  // Every route's secrets are kept out of every response (egress.ts).
  const secrets = new Secrets(config.egressFilter ? secretForms(config.routes).forms : []);
  const forwarders = new Map(config.routes.map((r) => [r.name, new Forwarder(r, config, secrets)]));
  const targets = new Map<string, Target>();
  for (const r of config.routes) {
    const forwarder = forwarders.get(r.name);
    if (r.credential !== null && forwarder !== undefined) targets.set(r.name, { credential: r.credential, forwarder });
  }
  return { config, table: routeTable(config.routes), forwarders, targets };
}
