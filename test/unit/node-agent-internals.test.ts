// request/agent.ts leans on parts of Node's http.Agent that are not public
// API: `addRequest` and `getName` on the prototype, the `freeSockets` and
// `sockets` lists by pool name, `req.onSocket`, and `socket._httpMessage`
// with its response while Node decides whether to keep a socket. Each is
// pinned here on plain Node objects, without keyward's agent, so a Node
// release that changes one fails this file by name rather than making the
// pool quietly stop reusing connections or reading Keep-Alive hints.
import assert from 'node:assert/strict';
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { test } from 'node:test';
import { upstreamAgent } from '../../src/request/agent.ts';

interface Internals {
  addRequest?: unknown;
  getName?: (options?: http.ClientRequestArgs) => string;
  freeSockets: Record<string, Socket[] | undefined>;
  sockets: Record<string, Socket[] | undefined>;
}

test('Node still has the agent internals the upstream pool reads', { timeout: 20_000 }, async () => {
  for (const Agent of [http.Agent, https.Agent]) {
    const proto = Agent.prototype as unknown as Internals;
    assert.equal(typeof proto.addRequest, 'function', `${Agent.name}.prototype.addRequest`);
    assert.equal(typeof proto.getName, 'function', `${Agent.name}.prototype.getName`);
    assert.equal(typeof Agent.prototype.reuseSocket, 'function', `${Agent.name}.prototype.reuseSocket`);
    assert.equal(typeof Agent.prototype.keepSocketAlive, 'function', `${Agent.name}.prototype.keepSocketAlive`);
  }
  assert.equal(typeof (http.ClientRequest.prototype as unknown as { onSocket?: unknown }).onSocket, 'function', 'ClientRequest.prototype.onSocket');

  const server = http.createServer((_req, res) => {
    res.setHeader('keep-alive', 'timeout=7');
    res.end('ok');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const port = (server.address() as AddressInfo).port;
  const agent = new (class extends http.Agent {
    seen: { message: unknown; hint: unknown } | null = null;
    override keepSocketAlive(socket: Socket): void {
      // What agent.ts's keepAliveHint reads: the socket's request and its response's headers, at this moment.
      const message = (socket as unknown as { _httpMessage?: { res?: { headers: Record<string, unknown> } } })._httpMessage;
      this.seen = { message, hint: message?.res?.headers['keep-alive'] };
      // Node's own returns whether to pool (agent.ts relies on that too): typed void by @types/node.
      return super.keepSocketAlive(socket);
    }
  })({ keepAlive: true });
  const internals = agent as unknown as Internals;
  try {
    let during: Record<string, Socket[] | undefined> = {};
    const socket = await new Promise<Socket>((resolve, reject) => {
      const req = http.get({ host: '127.0.0.1', port, path: '/', agent }, (res) => {
        // While the request runs, its socket is in `sockets` under the pool's name, and the socket names its request.
        // Copied now: Node moves the socket to freeSockets once the response ends.
        during = Object.fromEntries(Object.entries(internals.sockets).map(([k, v]) => [k, [...(v ?? [])]]));
        assert.equal((req.socket as unknown as { _httpMessage?: unknown })._httpMessage, req, 'socket._httpMessage is its request');
        res.resume();
        res.on('end', () => resolve(req.socket as Socket));
      });
      req.on('error', reject);
    });
    // One pool name for the origin, the one getName gives for it.
    const names = Object.keys(during);
    assert.equal(names.length, 1, 'agent.sockets is keyed by pool name');
    const name = names[0] as string;
    assert.ok(during[name]?.includes(socket), 'agent.sockets[name] holds the socket in use');
    assert.equal(name.startsWith(`127.0.0.1:${port}:`), true, `the pool name (${name}) begins with host:port:`);
    await new Promise((r) => setImmediate(r));
    assert.ok(internals.freeSockets[name]?.includes(socket), 'agent.freeSockets[name] holds it once free');
    assert.equal(agent.seen?.hint, 'timeout=7', "keepSocketAlive sees the response's Keep-Alive through socket._httpMessage.res");

    // keyward's own agent over the same internals: a second request reuses the pooled socket.
    const ours = upstreamAgent(new URL(`http://127.0.0.1:${port}`), { upstreamIdleMs: 4_000, upstreamMaxHeaderBytes: 16_384 });
    const reuse = (): Promise<boolean> =>
      new Promise((resolve, reject) => {
        const req = http.get({ host: '127.0.0.1', port, path: '/', agent: ours }, (res) => {
          res.resume();
          res.on('end', () => resolve(req.reusedSocket));
        });
        req.on('error', reject);
      });
    assert.equal(await reuse(), false);
    await new Promise((r) => setImmediate(r));
    assert.equal(await reuse(), true, 'the pooled socket handed straight to the next request');
    ours.destroy();
  } finally {
    agent.destroy();
    await new Promise((r) => server.close(r));
  }
});
