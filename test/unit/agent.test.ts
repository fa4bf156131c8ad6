// The upstream pool's idle lifetime (request/agent.ts; docs/configuration.md,
// KEYWARD_UPSTREAM_IDLE): the rule, and a real pooled socket closed by the
// agent's sweep with no timer of its own.
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { test } from 'node:test';
import { freeSockets, idleLifetime, upstreamAgent } from '../../src/request/agent.ts';
import { eventually } from '../support/deadline.ts';

test('idle lifetime: the configured one, or the upstream Keep-Alive timeout less a second when sooner; none at a second or less', () => {
  assert.equal(idleLifetime(4_000, null), 4_000);
  assert.equal(idleLifetime(4_000, 2), 1_000);
  assert.equal(idleLifetime(4_000, 30), 4_000);
  assert.equal(idleLifetime(600, 5), 600);
  assert.equal(idleLifetime(4_000, 1), 0);
  assert.equal(idleLifetime(4_000, 0), 0);
});

test('a pooled socket carries no timer, and is closed by the sweep once idle past its lifetime', async () => {
  const server = http.createServer((_req, res) => res.end('ok'));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  const agent = upstreamAgent(new URL(`http://127.0.0.1:${port}`), { upstreamIdleMs: 300, upstreamMaxHeaderBytes: 16_384 });
  try {
    const get = (): Promise<Socket> =>
      new Promise((resolve, reject) => {
        const req = http.get({ host: '127.0.0.1', port, path: '/', agent }, (res) => {
          res.resume();
          res.on('end', () => resolve(req.socket as Socket));
        });
        req.on('error', reject);
      });
    const first = await get();
    await eventually(() => freeSockets(agent).length === 1, 2_000, 'pooled');
    // Reused while it lives: the same socket serves the next request.
    assert.equal(await get(), first);
    await eventually(() => freeSockets(agent).length === 1, 2_000, 'pooled again');
    const [pooled] = freeSockets(agent);
    assert.equal(pooled?.timeout ?? 0, 0, 'no idle timer armed on the socket');
    const t0 = performance.now();
    await eventually(() => pooled?.destroyed === true, 3_000, 'closed once idle');
    const ms = performance.now() - t0;
    assert.ok(ms >= 200, `not before its lifetime (${ms.toFixed(0)} ms)`);
    // Node's agent takes a socket out of its pool on its `close`, a tick after it is destroyed.
    await eventually(() => freeSockets(agent).length === 0, 2_000, 'out of the pool');
  } finally {
    agent.destroy();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }
});
