// Nothing an upstream sends may crash the gateway or poison its connection pool.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

const OK = 'HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok';

test('the upstream reason phrase is never relayed: a control character or a secret in it reaches no client', async () => {
  let token = '';
  const up = await startRawUpstream((_head, i) =>
    i % 2 === 0 ? 'HTTP/1.1 200 O\x01K\r\ncontent-length: 2\r\n\r\nok' : `HTTP/1.1 200 ${token}\r\ncontent-length: 2\r\n\r\nok`,
  );
  const gw = await startGateway({ speech: up.url, scraper: up.url });
  token = gw.secrets.scraperToken;
  try {
    const { raw } = await import('../support/client.ts');
    for (let i = 0; i < 4; i++) {
      const out = await raw(gw.port, `GET /speech/v1/voices HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nconnection: close\r\n\r\n`);
      assert.match(out, /^HTTP\/1\.1 200 OK\r\n/, 'the standard phrase');
      assert.ok(!out.includes(token) && !out.includes('\x01'), "nothing of the upstream's phrase");
      assert.ok(out.endsWith('ok'));
    }
  } finally {
    await gw.close();
    await up.close();
  }
});

test('an upstream header value Node refuses to relay is a 502, not a crash', async () => {
  const up = await startRawUpstream(() => 'HTTP/1.1 200 OK\r\nx-bad: a\x7fb\r\ncontent-length: 2\r\n\r\nok');
  const gw = await startGateway({ seo: up.url });
  try {
    const r = await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } });
    // llhttp may already refuse the header (a parse error: 502 as well); either way no crash.
    assert.equal(r.status, 502);
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status, 502);
  } finally {
    await gw.close();
    await up.close();
  }
});

for (const [name, reply] of [
  ['without an Upgrade header', 'HTTP/1.1 101 Switching Protocols\r\n\r\n'],
  ['with an Upgrade header', 'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n'],
] as const) {
  test(`an unexpected 101 ${name} is a 502 and its connection is never reused`, async () => {
    const up = await startRawUpstream((_head, i) => (i === 0 ? reply : OK));
    const gw = await startGateway({ speech: up.url });
    try {
      const auth = { authorization: `Bearer ${gw.token}` };
      const r = await request(`${gw.url}/speech/v1/voices`, { headers: auth, timeoutMs: 5_000 });
      assert.equal(r.status, 502);
      assert.equal((r.json() as { code: string }).code, 'upstream_unreachable');
      await eventually(() => up.open() === 0, 2_000, 'the switched connection is closed');
      const next = await request(`${gw.url}/speech/v1/voices`, { headers: auth });
      assert.equal(next.status, 200);
      assert.equal(up.connections(), 2, 'the next request opened a fresh connection');
      const line = gw.logs().find((l) => l.msg === 'request completed' && l.status === 502);
      assert.equal(line?.error, 'unexpected_101');
      assert.equal(line?.level, 40);
    } finally {
      await gw.close();
      await up.close();
    }
  });
}
