// A body labelled gzip that is not gzip gave the client no status line at
// all, while the log said 200 and the ledger counted a 2xx. It is a 502 now,
// logged and counted as the failure it is (docs/security.md).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';
import { MemoryUsageStore } from '../../src/ledger/memory-store.ts';

test('a body that does not decode in its declared coding is a 502, logged and counted as such', async () => {
  const up = await startUpstream((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': 'gzip' });
    res.end('{"this is":"not gzip at all"}');
  });
  const store = new MemoryUsageStore();
  const gw = await startGateway({ seo: up.url, usageStore: store });
  try {
    const r = await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}`, 'accept-encoding': 'gzip' } });
    assert.equal(r.status, 502);
    assert.deepEqual(r.json(), { error: 'The upstream answered in a content coding the gateway cannot inspect.', code: 'upstream_unreachable' });
    await gw.gateway.shutdown();
    const line = gw.logs().find((l) => l.msg === 'request completed');
    assert.equal(line?.status, 502);
    assert.equal(line?.error, 'undecodable');
    const rows = await store.rows({});
    assert.equal(
      rows.reduce((n, x) => n + x.s2xx, 0),
      0,
      'no 2xx in the ledger',
    );
    assert.equal(
      rows.reduce((n, x) => n + x.other, 0),
      1,
      'counted as no upstream answer reaching the client',
    );
  } finally {
    await gw.close();
    await up.close();
  }
});
