// Idle pooled upstream connections were kept past the upstream's own idle
// timeout, so the upstream closed them under a request (docs/security.md,
// "Upstream connections"): closed after KEYWARD_UPSTREAM_IDLE, or sooner
// when the upstream's Keep-Alive says so.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

test('idle pooled upstream connections are closed after KEYWARD_UPSTREAM_IDLE, or sooner when the upstream says Keep-Alive: timeout=N', async () => {
  const plain = await startRawUpstream(() => 'HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok');
  const hinted = await startRawUpstream(() => 'HTTP/1.1 200 OK\r\nkeep-alive: timeout=2\r\ncontent-length: 2\r\n\r\nok');
  const gw = await startGateway({ seo: plain.url, speech: hinted.url, env: { KEYWARD_UPSTREAM_IDLE: '600ms' } });
  const gw2 = await startGateway({ speech: hinted.url, env: { KEYWARD_UPSTREAM_IDLE: '30s' } });
  try {
    assert.equal(gw.config.upstreamIdleMs, 600);
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status, 200);
    assert.equal(plain.open(), 1, 'pooled');
    const t0 = performance.now();
    await eventually(() => plain.open() === 0, 5_000, 'closed by the gateway after its idle lifetime');
    const plainMs = performance.now() - t0;
    assert.ok(plainMs >= 400, `not before the idle lifetime (${plainMs.toFixed(0)} ms)`);
    // timeout=2: Node keeps it one second less than announced, shorter than the 30 s configured.
    assert.equal((await request(`${gw2.url}/speech/v1/x`, { headers: { authorization: `Bearer ${gw2.token}` } })).status, 200);
    const t1 = performance.now();
    await eventually(() => hinted.open() === 0, 5_000, 'closed at the hint');
    const hintMs = performance.now() - t1;
    assert.ok(hintMs >= 700, `at the hint less a second, not before (${hintMs.toFixed(0)} ms)`);
    console.log(`idle upstream connection closed after ${plainMs.toFixed(0)} ms (idle 600ms), ${hintMs.toFixed(0)} ms (Keep-Alive: timeout=2, idle 30s)`);
  } finally {
    await gw.close();
    await gw2.close();
    await plain.close();
    await hinted.close();
  }
});
