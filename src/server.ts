// The node:http server around the pipeline: timeouts and limits, the events
// Node raises outside a normal request (parse errors, upgrades, CONNECT,
// `Expect: 100-continue`), live key reloads, and the drain on shutdown.
import http, { type ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { Config } from './config.ts';
import { ERRORS, writeRawError } from './errors.ts';
import { GatewayRequest } from './exchange.ts';
import { Forwarder } from './forward.ts';
import { KeySet } from './keys/keyset.ts';
import type { KeyStore } from './keys/store.ts';
import type { Logger } from './log.ts';
import { createPipeline } from './pipeline.ts';
import { routeTable } from './routes.ts';

export interface Gateway {
  readonly server: http.Server;
  /** Start listening; resolves with the bound address. */
  listen(): Promise<AddressInfo>;
  /** Stop accepting, let in-flight requests finish up to the drain deadline, close everything. */
  shutdown(): Promise<void>;
  /** Re-read the key store now (SIGHUP); keeps the current set if the store cannot be read. */
  reloadKeys(): Promise<void>;
  keyCount(): number;
}

export async function createGateway(config: Config, store: KeyStore, logger: Logger): Promise<Gateway> {
  const loadStarted = performance.now();
  let keys = new KeySet(await store.load());
  const keysLoadMs = Math.round(performance.now() - loadStarted);
  let draining = false;
  const table = routeTable(config.routes);
  const forwarders = new Map(config.routes.map((r) => [r.name, new Forwarder(r, config)]));

  const applyKeys = (records: ConstructorParameters<typeof KeySet>[0]): void => {
    keys = new KeySet(records);
    logger.info({ keys: keys.size }, 'keys reloaded');
  };
  const keysError = (err: Error): void => {
    // The last good set stays in force (design §5).
    logger.error({ err: { type: err.name, message: err.message }, keysFile: store.location }, 'keys not reloaded; keeping the previous set');
  };
  const stopWatch = store.watch(applyKeys, keysError);

  const pipeline = createPipeline({
    config,
    table,
    forwarders,
    logger,
    keys: () => keys,
    draining: () => draining,
  });

  const server = http.createServer({
    IncomingMessage: GatewayRequest,
    // Slow-loris guard for headers; bodies may legitimately take long (1 GB uploads).
    headersTimeout: config.headersTimeoutMs,
    requestTimeout: 0,
    keepAliveTimeout: config.keepAliveTimeoutMs,
    // The upstream gets its own Host; a missing one must not turn into Node's plain-text 400.
    requireHostHeader: false,
  });

  server.on('request', (req: GatewayRequest, res: ServerResponse) => pipeline.handle(req, res, false));
  // Answer `100 Continue` only once the request passed authentication and
  // routing: a refused upload is refused before the client sends its body.
  server.on('checkContinue', (req: GatewayRequest, res: ServerResponse) => pipeline.handle(req, res, true));
  // WebSockets are never proxied (design §1); nor is any other protocol switch.
  server.on('upgrade', (req: GatewayRequest, socket: Duplex) => pipeline.refuseRaw(req, socket, ERRORS.webSocket));
  server.on('connect', (req: GatewayRequest, socket: Duplex) => pipeline.refuseRaw(req, socket, ERRORS.noRoute));
  server.on('clientError', (err: NodeJS.ErrnoException, socket: Duplex) => {
    const s = socket as Socket & { _httpMessage?: unknown };
    // Mid-response (pipelining) or a client already gone: a raw write would corrupt the stream.
    if (err.code === 'ECONNRESET' || s._httpMessage || !s.writable || !err.code?.startsWith('HPE_')) {
      s.destroy();
      return;
    }
    logger.info({ error: err.code }, 'malformed request refused');
    writeRawError(s, ERRORS.malformed);
  });

  let closing: Promise<void> | null = null;

  return {
    server,
    listen: () =>
      new Promise((resolve, reject) => {
        server.once('error', reject);
        server.listen(config.port, config.host, () => {
          server.off('error', reject);
          const address = server.address() as AddressInfo;
          logger.info(
            {
              address: address.address,
              port: address.port,
              routes: config.enabledRoutes,
              disabledRoutes: config.routes.filter((r) => r.credential === null).map((r) => r.name),
              keys: keys.size,
              keysLoadMs,
              keysFile: store.location,
            },
            'keyward listening',
          );
          resolve(address);
        });
      }),
    shutdown: () => {
      closing ??= new Promise<void>((resolve) => {
        draining = true;
        stopWatch();
        logger.info({ drainTimeoutMs: config.drainTimeoutMs }, 'draining');
        // Connections become idle as their last response ends; close them as they do.
        const sweep = setInterval(() => server.closeIdleConnections(), 100);
        const deadline = setTimeout(() => {
          logger.warn('drain deadline reached; closing remaining connections');
          server.closeAllConnections();
        }, config.drainTimeoutMs);
        server.close(() => {
          clearInterval(sweep);
          clearTimeout(deadline);
          for (const f of forwarders.values()) f.close();
          logger.info('stopped');
          resolve();
        });
        server.closeIdleConnections();
      });
      return closing;
    },
    reloadKeys: async () => {
      try {
        applyKeys(await store.load());
      } catch (err) {
        keysError(err as Error);
      }
    },
    keyCount: () => keys.size,
  };
}
