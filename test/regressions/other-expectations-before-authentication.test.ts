// Hardening, round 2. An `Expect` other than 100-continue was answered by Node itself (a bare 417)
// before authentication, unlogged and uncounted: it now goes through the
// gateway (docs/responses.md).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('Expect other than 100-continue goes through the gateway: 401 without a token, 417 JSON with one, logged and never forwarded', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  try {
    const anon = await raw(gw.port, 'POST /seo/v3/x HTTP/1.1\r\nhost: x\r\nexpect: 200-ok\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
    assert.match(anon, /^HTTP\/1\.1 401 /);
    assert.match(anon, /\{"error":"Unauthorized\.","code":"unauthorized"\}$/);
    const authed = await raw(
      gw.port,
      `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\nexpect: 200-ok\r\nauthorization: Bearer ${gw.token}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n`,
    );
    assert.match(authed, /^HTTP\/1\.1 417 /);
    assert.match(authed, /content-type: application\/json/i);
    assert.match(authed, /\{"error":"Only Expect: 100-continue is supported\.","code":"expectation_failed"\}$/);
    assert.equal(up.requests.length, 0);
    await eventually(() => gw.logs().filter((l) => l.msg === 'request completed').length === 2, 2_000, 'two log lines');
    const statuses = gw
      .logs()
      .filter((l) => l.msg === 'request completed')
      .map((l) => l.status);
    assert.deepEqual(statuses, [401, 417]);
  } finally {
    await gw.close();
    await up.close();
  }
});
