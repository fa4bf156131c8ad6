// The pipeline checked the key set for null and then read it again with a
// cast: when a shared store's KEYWARD_KEYS_MAX_STALENESS ran out between the
// two reads, the second was null, the TypeError escaped the request handler
// and the process exited. The set is now read once per request and passed
// on. Here the set vanishes right after its first read, on both the normal
// and the raw (upgrade) path.
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { readFileSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createCompletion } from '../../src/request/completion.ts';
import { loadConfig } from '../../src/config/load.ts';
import { GatewayRequest } from '../../src/request/exchange.ts';
import { expire } from '../../src/request/forward.ts';
import { FileKeyStore } from '../../src/keys/file-store.ts';
import { KeySet } from '../../src/keys/keyset.ts';
import { LastUse } from '../../src/keys/last-use.ts';
import { createKey } from '../../src/keys/manage.ts';
import { createLogger } from '../../src/observe/log.ts';
import { Metrics } from '../../src/observe/metrics.ts';
import { createPipeline } from '../../src/request/pipeline.ts';
import { ERRORS } from '../../src/request/errors.ts';
import { CredentialBoard } from '../../src/request/credentials.ts';
import { buildRuntime } from '../../src/process/runtime.ts';
import { Capacity } from '../../src/capacity/capacity.ts';
import { Sweeper } from '../../src/request/timers.ts';
import { Ledger } from '../../src/ledger/ledger.ts';
import { MemoryUsageStore } from '../../src/ledger/memory-store.ts';
import { raw, request } from '../support/client.ts';
import { startUpstream } from '../support/upstream.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';

test('a key set that vanishes after its first read in a request neither crashes the process nor serves a refusal it should not', async () => {
  const up = await startUpstream();
  const dir = mkdtempSync(join(tmpdir(), 'keyward-vanish-'));
  const crashes: Error[] = [];
  const onCrash = (err: Error): void => void crashes.push(err);
  process.on('uncaughtException', onCrash);
  try {
    const config = loadConfig(
      { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'login-value', KEYWARD_SEO_PASSWORD: 'password-value' },
      (p) => readFileSync(p, 'utf8'),
      dir,
      UPSTREAMS,
    );
    const store = new FileKeyStore(config.keysFile, costRoutes(UPSTREAMS));
    const { token } = await createKey(store, 'v');
    const set = new KeySet(await store.load());
    const metrics = new Metrics({ routes: config.routes.map((r) => r.name) });
    const logger = createLogger('silent', new Writable({ write: (_c, _e, cb) => cb() })).logger;
    const ledger = new Ledger(new MemoryUsageStore(), () => undefined);
    const board = new CredentialBoard();
    const room = new Capacity(config, () => true);
    const runtime = buildRuntime(config, board, room);
    // Present at the first read of each request, gone at any later one (the staleness limit ran out in between).
    let perRequest = 0;
    const twice = createPipeline({
      runtime: () => runtime,
      keys: () => (++perRequest % 2 === 1 ? set : null),
      draining: () => false,
      credentials: board,
      room,
      ledgerDamaged: () => false,
      sweeper: new Sweeper(() => config, expire),
      metrics,
      lastUse: new LastUse(store, 60_000, () => undefined),
      complete: createCompletion(logger, metrics, () => new Set(), ledger),
      admit: () => ({ kind: 'admitted', done: () => undefined }),
      ledger,
      keyStatus: () => null,
    });
    const server = http.createServer({ IncomingMessage: GatewayRequest }, (req, res) => twice.handle(req, res, 'none'));
    server.on('upgrade', (req, socket) => twice.refuseRaw(req, socket, ERRORS.webSocket));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const port = (server.address() as AddressInfo).port;
    try {
      const r = await request(`http://127.0.0.1:${port}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } });
      assert.equal(r.status, 200, 'served with the set read at the start of the request');
      perRequest = 0;
      const upgraded = await raw(
        port,
        `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n`,
      );
      assert.match(upgraded, /^HTTP\/1\.1 (400|404|426|501) /, 'the upgrade refused as usual, not a crash');
      await new Promise((r) => setImmediate(r));
      assert.deepEqual(crashes, [], 'nothing escaped the handlers');
    } finally {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  } finally {
    process.off('uncaughtException', onCrash);
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
