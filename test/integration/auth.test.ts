// docs/authentication.md and docs/keys.md: who gets in, and how fast key changes take effect.
import assert from 'node:assert/strict';
import { readFile, rename, writeFile } from 'node:fs/promises';
import { test } from 'node:test';
import net from 'node:net';
import { raw, request, statusLines } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway, type GatewayOptions, type TestGateway } from '../support/gateway.ts';
import { startUpstream, type MockUpstream } from '../support/upstream.ts';
import { createKey, revokeKey } from '../../src/keys/manage.ts';
import { generateToken } from '../../src/keys/token.ts';
import type { FileKeyStore } from '../../src/keys/file-store.ts';

async function withGateway(fn: (gw: TestGateway, up: MockUpstream) => Promise<void>, prepare?: GatewayOptions['prepare']): Promise<void> {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, ...(prepare === undefined ? {} : { prepare }) });
  try {
    await fn(gw, up);
  } finally {
    await gw.close();
    await up.close();
  }
}

const UNAUTHORIZED = { error: 'Unauthorized.', code: 'unauthorized' };

test('missing, malformed, unknown, expired and revoked tokens get 401 on any path and forward nothing', async () => {
  // Made before the gateway reads the file: a reload between the creation and the revocation
  // would otherwise let the revoked key in until the next one.
  let expired = { token: '' };
  let revoked = { token: '' };
  const prepare = async (store: FileKeyStore): Promise<void> => {
    expired = await createKey(store, 'short-lived', { expiresInMs: 1 }, Date.now() - 10_000);
    revoked = await createKey(store, 'gone');
    await revokeKey(store, 'gone');
  };
  await withGateway(async (gw, up) => {
    const good = gw.token;
    const headers: Array<Record<string, string>> = [
      {},
      { authorization: '' },
      { authorization: `Basic ${Buffer.from(`x:${good}`).toString('base64')}` },
      { authorization: good },
      { authorization: `Bearer${good}` },
      { authorization: `Token ${good}` },
      { authorization: `Bearer ${good.slice(0, -1)}${good.endsWith('a') ? 'b' : 'a'}` },
      { authorization: `Bearer ${good}x` },
      { authorization: 'Bearer kw_short' },
      { authorization: `Bearer ${generateToken()}` },
      { authorization: `Bearer ${expired.token}` },
      { authorization: `Bearer ${revoked.token}` },
    ];
    for (const path of ['/seo/v3/x', '/nowhere', '/', '/speech']) {
      for (const h of headers) {
        const r = await request(`${gw.url}${path}`, { headers: h });
        assert.equal(r.status, 401, `${path} ${JSON.stringify(h)}`);
        assert.equal(r.headers['content-type'], 'application/json');
        assert.deepEqual(r.json(), UNAUTHORIZED);
      }
    }
    assert.equal(up.connections(), 0);
  }, prepare);
});

test('the Bearer scheme is case-insensitive (RFC 9110 §11.1)', async () => {
  await withGateway(async (gw) => {
    for (const scheme of ['Bearer', 'bearer', 'BEARER', 'bEaReR']) {
      const r = await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `${scheme} ${gw.token}` } });
      assert.equal(r.status, 200, scheme);
    }
  });
});

test('a revoked key is refused within one second, a new key accepted within one second, without a restart', async () => {
  await withGateway(async (gw) => {
    const url = `${gw.url}/seo/v3/x`;
    const auth = { authorization: `Bearer ${gw.token}` };
    assert.equal((await request(url, { headers: auth })).status, 200);
    const revokedAt = Date.now();
    await revokeKey(gw.store, gw.keyId);
    await eventually(async () => (await request(url, { headers: auth })).status === 401, 1_000, 'revocation took effect');
    const revokeLatency = Date.now() - revokedAt;
    assert.ok(revokeLatency <= 1_000, `revocation took ${revokeLatency} ms`);

    const fresh = await createKey(gw.store, 'newcomer');
    await eventually(async () => (await request(url, { headers: { authorization: `Bearer ${fresh.token}` } })).status === 200, 1_000, 'new key accepted');
    assert.ok(gw.logs().some((l) => l.msg === 'keys reloaded'));
  });
});

/** One connection kept open: `send` writes a request and resolves with the bytes of its response (one with a Content-Length). */
function connection(port: number): { send(bytes: string): Promise<string>; close(): void } {
  const socket = net.connect(port, '127.0.0.1');
  socket.setEncoding('latin1');
  let received = '';
  let waiting: (() => void) | null = null;
  socket.on('data', (d: string) => {
    received += d;
    waiting?.();
  });
  const complete = (): string | null => {
    const end = received.indexOf('\r\n\r\n');
    if (end < 0) return null;
    const length = Number(/\r\ncontent-length: (\d+)/i.exec(received.slice(0, end))?.[1] ?? 0);
    if (received.length < end + 4 + length) return null;
    const one = received.slice(0, end + 4 + length);
    received = received.slice(end + 4 + length);
    return one;
  };
  return {
    send: (bytes) =>
      deadline(
        new Promise<string>((resolve) => {
          waiting = () => {
            const one = complete();
            if (one !== null) {
              waiting = null;
              resolve(one);
            }
          };
          socket.write(bytes);
        }),
        5_000,
        'an answer on the open connection',
      ),
    close: () => socket.destroy(),
  };
}

test('one connection, several tokens: each request is its own key, a malformed one is refused between them, and a revocation stops the very next request of an open connection', async () => {
  await withGateway(async (gw) => {
    const second = await createKey(gw.store, 'second-holder');
    const ask = (token: string): string => `GET /keyward/key HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${token}\r\n\r\n`;
    await eventually(
      async () => (await request(`${gw.url}/keyward/key`, { headers: { authorization: `Bearer ${second.token}` } })).status === 200,
      5_000,
      'second key loaded',
    );
    // Pipelined on one connection: the key of each answer is the key of its own token.
    const order = [gw.token, second.token, gw.token, `${gw.token.slice(0, -1)}!`, gw.token, second.token];
    const got = await raw(gw.port, order.map(ask).join(''), { until: (r) => statusLines(r).length === order.length });
    assert.deepEqual(
      statusLines(got).map((l) => l.slice(9, 12)),
      ['200', '200', '200', '401', '200', '200'],
    );
    assert.deepEqual(
      [...got.matchAll(/"name":"([^"]+)"/g)].map((m) => m[1]),
      ['tester', 'second-holder', 'tester', 'tester', 'second-holder'],
    );

    // Open across a revocation: the connection's next request is refused.
    const open = connection(gw.port);
    try {
      assert.match(await open.send(ask(gw.token)), /^HTTP\/1\.1 200/);
      await revokeKey(gw.store, gw.keyId);
      await eventually(
        async () => (await request(`${gw.url}/keyward/key`, { headers: { authorization: `Bearer ${gw.token}` } })).status === 401,
        5_000,
        'revocation in force',
      );
      assert.match(await open.send(ask(gw.token)), /^HTTP\/1\.1 401/);
      assert.match(await open.send(ask(second.token)), /^HTTP\/1\.1 200/);
      assert.match(await open.send(ask(gw.token)), /^HTTP\/1\.1 401/);
    } finally {
      open.close();
    }
  });
});

test('a corrupt keys file never replaces the keys in memory', async () => {
  await withGateway(async (gw) => {
    const url = `${gw.url}/seo/v3/x`;
    const auth = { authorization: `Bearer ${gw.token}` };
    const good = await readFile(gw.store.location, 'utf8');
    const tmp = `${gw.store.location}.broken`;
    await writeFile(tmp, '{"version":1,"keys":[{"id":');
    await rename(tmp, gw.store.location);
    await eventually(() => gw.logs().some((l) => l.msg === 'keys not reloaded; keeping the previous set'), 2_000, 'error logged');
    assert.equal((await request(url, { headers: auth })).status, 200);
    const line = gw.logs().find((l) => l.level === 50);
    assert.match(JSON.stringify(line), /not valid JSON/);

    // An empty file (a half-written one) is refused the same way.
    await writeFile(tmp, '');
    await rename(tmp, gw.store.location);
    await eventually(() => gw.logs().filter((l) => l.level === 50).length >= 2, 2_000, 'second error logged');
    assert.equal((await request(url, { headers: auth })).status, 200);

    // The CLI refuses to build on a corrupt file rather than overwrite it…
    await assert.rejects(createKey(gw.store, 'on-top'), /not valid JSON/);
    // …and once it is repaired, changes flow again.
    await writeFile(tmp, good);
    await rename(tmp, gw.store.location);
    const fresh = await createKey(gw.store, 'after-repair');
    await eventually(async () => (await request(url, { headers: { authorization: `Bearer ${fresh.token}` } })).status === 200, 1_000, 'repaired file loaded');
    assert.equal((await request(url, { headers: auth })).status, 200);
  });
});

test('SIGHUP-style reload re-reads the store at once and keeps the set on failure', async () => {
  await withGateway(async (gw) => {
    const fresh = await createKey(gw.store, 'hup');
    await gw.gateway.reloadKeys();
    assert.equal(gw.gateway.keyCount(), 2);
    await writeFile(gw.store.location, 'nonsense');
    await gw.gateway.reloadKeys();
    assert.equal(gw.gateway.keyCount(), 2);
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${fresh.token}` } })).status, 200);
  });
});
