// What the request path reads of one configuration generation
// (docs/configuration.md): the route table and each route's target, built
// once from a frozen configuration by process/runtime.ts and swapped whole
// on reload; a request keeps the one it started under.
import type { Forwarder } from './forward.ts';
import type { BlockList } from 'node:net';
import type { CredentialSettings } from './credentials.ts';
import type { RouteTable } from './routes.ts';

export interface Generation {
  readonly table: RouteTable;
  /** Each configured route's credential and forwarder; a route without its secrets has none. */
  readonly targets: ReadonlyMap<string, Target>;
  /** The settings the pipeline itself reads. */
  readonly config: { readonly maxBodyBytes: number; readonly replayMaxBodyBytes: number } & CredentialSettings;
  /** KEYWARD_TRUSTED_PROXIES as a set; null when none is trusted. */
  readonly trustedProxies: BlockList | null;
}

/** Where an admitted request goes: its forwarder (the credential is chosen per request, credentials.ts). */
export interface Target {
  readonly forwarder: Forwarder;
}
