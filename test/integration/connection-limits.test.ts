// Request header size and open-connection limits (docs/responses.md, configuration.md).
import assert from 'node:assert/strict';
import net from 'node:net';
import { test } from 'node:test';
import { raw, request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('request headers over KEYWARD_MAX_HEADER_SIZE get 431 headers_too_large JSON and never reach the upstream', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, env: { KEYWARD_MAX_HEADER_SIZE: '4KiB' } });
  try {
    const auth = `authorization: Bearer ${gw.token}\r\n`;
    const small = await raw(gw.port, `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}x-pad: ${'a'.repeat(2_000)}\r\nconnection: close\r\n\r\n`);
    assert.match(small, /^HTTP\/1\.1 200 /);
    const big = await raw(gw.port, `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\n${auth}x-pad: ${'a'.repeat(5_000)}\r\n\r\n`);
    assert.match(big, /^HTTP\/1\.1 431 /);
    assert.match(big, /content-type: application\/json/);
    assert.ok(big.endsWith('{"error":"Request headers exceed the configured limit.","code":"headers_too_large"}'), big);
    assert.equal(up.requests.length, 1);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('beyond KEYWARD_MAX_CONNECTIONS new connections are closed at once while open ones are served', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, env: { KEYWARD_MAX_CONNECTIONS: '3' } });
  const held: net.Socket[] = [];
  try {
    for (let i = 0; i < 3; i++) {
      const s = net.connect(gw.port, '127.0.0.1');
      await deadline(new Promise((r) => s.once('connect', r)), 2_000, 'connect');
      held.push(s);
    }
    await eventually(async () => (await new Promise<number>((r) => gw.gateway.server.getConnections((_e, n) => r(n)))) === 3, 2_000, 'three open');
    // The fourth is accepted by the kernel and closed by the gateway without an answer.
    const extra = await raw(gw.port, `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\n\r\n`, { timeoutMs: 3_000 });
    assert.equal(extra, '');
    // The connections already open are served.
    for (const s of held) {
      const answer = new Promise<string>((resolve) => {
        let got = '';
        s.setEncoding('latin1').on('data', (d: string) => {
          got += d;
          if (got.includes('"ok":true')) resolve(got);
        });
      });
      s.write(`GET /seo/v3/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\n\r\n`);
      assert.match(await deadline(answer, 3_000, 'held connection served'), /^HTTP\/1\.1 200 /);
    }
    for (const s of held) s.destroy();
    await eventually(async () => (await new Promise<number>((r) => gw.gateway.server.getConnections((_e, n) => r(n)))) === 0, 2_000, 'all closed');
    const after = await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(after.status, 200, 'new connections are accepted again once below the limit');
  } finally {
    for (const s of held) s.destroy();
    await gw.close();
    await up.close();
  }
});
