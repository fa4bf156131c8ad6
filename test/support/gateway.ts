// An in-process gateway for one test: its own temporary keys file, its own
// upstream secrets, its own log capture, on 127.0.0.1:0. Nothing is shared.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { loadConfig, type Config } from '../../src/config/load.ts';
import { freePort } from '../../src/process/listen.ts';
import { FileKeyStore } from '../../src/keys/file-store.ts';
import { createKey } from '../../src/keys/manage.ts';
import { createLogger } from '../../src/observe/log.ts';
import { providerEnv, UPSTREAMS, type UpstreamSpec } from '../../src/request/routes.ts';
import { createGateway, type GatewayOptions as GatewayCreateOptions, type Gateway } from '../../src/process/server.ts';
import type { Limits } from '../../src/keys/limits.ts';
import type { UsageStore } from '../../src/ledger/store.ts';

export interface Secrets {
  readonly scraperToken: string;
  readonly seoLogin: string;
  readonly seoPassword: string;
  readonly speechKey: string;
}

export interface TestGateway {
  readonly url: string;
  readonly port: number;
  readonly token: string;
  readonly keyId: string;
  readonly secrets: Secrets;
  readonly config: Config;
  /** The environment the configuration was read from (a reload's starting point). */
  readonly env: Readonly<Record<string, string>>;
  readonly store: FileKeyStore;
  readonly gateway: Gateway;
  /** Every log line so far, parsed. */
  logs(): Array<Record<string, unknown>>;
  /** The raw log text so far. */
  logText(): string;
  close(): Promise<void>;
}

export interface GatewayOptions {
  readonly scraper?: string;
  readonly seo?: string;
  readonly speech?: string;
  /** Upstream URLs by route name, for any provider of the table. */
  readonly upstreams?: Readonly<Record<string, string>>;
  /** The provider table (routes.ts); a test may add a provider. */
  readonly providers?: readonly UpstreamSpec[];
  /** Upstream secrets by route name (default: each provider's samples). */
  readonly secrets?: Readonly<Record<string, readonly string[]>>;
  /** Extra or overriding environment. */
  readonly env?: Record<string, string>;
  /** How often last-use times are written, ms. */
  readonly lastUseFlushMs?: number;
  /** The usage ledger's store (default: the SQLite file beside the keys file). */
  readonly usageStore?: UsageStore;
  /** Limits of the test key, as `keys create` stores them. */
  readonly limits?: Limits;
  /** The test key's name (default `tester`). */
  readonly keyName?: string;
  /** A folder to keep the keys file and ledger in, kept at close (a restart in the same place); default: a new one, removed at close. */
  readonly dir?: string;
  /** The scraper settler's pace (ledger/runs.ts). */
  readonly settle?: GatewayCreateOptions['settle'];
  /** Changes to the keys file made before the gateway reads it (so a test need not wait for a reload). */
  readonly prepare?: (store: FileKeyStore) => Promise<void>;
}

/** Each provider's sample secrets (routes.ts), by route name, with a tag of their own. */
export function sampleSecrets(providers: readonly UpstreamSpec[] = UPSTREAMS): Record<string, readonly string[]> {
  // Distinctive, greppable values: a test can search any byte stream for them.
  const tag = randomBytes(6).toString('hex');
  return Object.fromEntries(providers.map((p) => [p.name, p.sampleSecrets(`${p.name.toUpperCase()}SECRET${tag}`)]));
}

/** The three shipped providers' secrets by name, as most tests use them. */
export function makeSecrets(byRoute: Readonly<Record<string, readonly string[]>> = sampleSecrets()): Secrets {
  const get = (route: string, i: number): string => byRoute[route]?.[i] ?? '';
  return { scraperToken: get('scraper', 0), seoLogin: get('seo', 0), seoPassword: get('seo', 1), speechKey: get('speech', 0) };
}

export async function startGateway(options: GatewayOptions = {}): Promise<TestGateway> {
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), 'keyward-test-'));
  const providers = options.providers ?? UPSTREAMS;
  const byRoute = options.secrets ?? sampleSecrets(providers);
  const secrets = makeSecrets(byRoute);
  // A port nothing listens on: requests to an upstream not given here are refused.
  const unreachable = `http://127.0.0.1:${await freePort()}`;
  const env: Record<string, string> = {
    KEYWARD_HOST: '127.0.0.1',
    KEYWARD_PORT: '0',
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_LOG_LEVEL: 'info',
    ...Object.assign(
      {},
      ...providers.map((p) =>
        providerEnv(p, options.upstreams?.[p.name] ?? (options as Record<string, unknown>)[p.name]?.toString() ?? unreachable, byRoute[p.name] ?? []),
      ),
    ),
    ...options.env,
  };
  const config = loadConfig(env, (p) => readFileSync(p, 'utf8'), dir, providers);
  const store = new FileKeyStore(config.keysFile, config.costRoutes);
  const { token, record } = await createKey(store, options.keyName ?? 'tester', options.limits === undefined ? {} : { limits: options.limits });
  await options.prepare?.(store);
  let text = '';
  const sink = new Writable({
    write(chunk: Buffer, _enc, cb) {
      text += chunk.toString('utf8');
      cb();
    },
  });
  const log = createLogger(config.logLevel, sink);
  const gateway = await createGateway(config, store, log.logger, {
    ...(options.lastUseFlushMs === undefined ? {} : { lastUseFlushMs: options.lastUseFlushMs }),
    ...(options.usageStore === undefined ? {} : { usageStore: options.usageStore }),
    ...(options.settle === undefined ? {} : { settle: options.settle }),
  });
  const address = await gateway.listen();
  return {
    url: `http://127.0.0.1:${address.port}`,
    port: address.port,
    token,
    keyId: record.id,
    secrets,
    config,
    env,
    store,
    gateway,
    logs: () =>
      text
        .split('\n')
        .filter((l) => l.length > 0)
        .map((l) => JSON.parse(l) as Record<string, unknown>),
    logText: () => text,
    close: async () => {
      gateway.server.closeAllConnections();
      await gateway.shutdown();
      if (options.dir === undefined) rmSync(dir, { recursive: true, force: true });
    },
  };
}
