// Nothing an upstream sends may crash the gateway or poison its connection pool.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

const OK = 'HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok';

test('a control character in the upstream reason phrase is a 502, and the gateway keeps serving', async () => {
  const up = await startRawUpstream((_head, i) => (i % 2 === 0 ? 'HTTP/1.1 200 O\x01K\r\ncontent-length: 2\r\n\r\nok' : OK));
  const gw = await startGateway({ speech: up.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    for (let i = 0; i < 3; i++) {
      const bad = await request(`${gw.url}/speech/v1/voices`, { headers: auth });
      assert.equal(bad.status, 502);
      assert.deepEqual(bad.json(), { error: 'Upstream unreachable.', code: 'upstream_unreachable' });
      const good = await request(`${gw.url}/speech/v1/voices`, { headers: auth });
      assert.equal(good.status, 200);
      assert.equal(good.body.toString(), 'ok');
    }
    const lines = gw.logs().filter((l) => l.msg === 'request completed');
    assert.equal(lines.filter((l) => l.error === 'invalid_upstream_response').length, 3);
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
