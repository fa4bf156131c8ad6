// `Content-Encoding: gzip,gzip,…` three thousand times on a 50 KB body took
// a core for over a minute per request: every coding is one more decoder
// over the whole body. More than three stacked codings is a 502 now
// (docs/security.md); up to three still pass, scanned.
import assert from 'node:assert/strict';
import { gzipSync } from 'node:zlib';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('three stacked codings are relayed; four or three thousand are refused with 502 at once', async () => {
  const plain = Buffer.from('{"status_code":20000,"ok":true}');
  const wrapped = (n: number): Buffer => {
    let body = plain;
    for (let i = 0; i < n; i++) body = gzipSync(body);
    return body;
  };
  let codings = 3;
  const up = await startUpstream((req, res) => {
    req.resume();
    const n = Math.min(codings, 4);
    res.writeHead(200, { 'content-type': 'application/json', 'content-encoding': Array(codings).fill('gzip').join(','), 'content-length': wrapped(n).length });
    res.end(wrapped(n));
  });
  const gw = await startGateway({ seo: up.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}`, 'accept-encoding': 'gzip' };
    const three = await request(`${gw.url}/seo/v3/x`, { headers: auth });
    assert.equal(three.status, 200);
    assert.equal(three.headers['content-encoding'], 'gzip,gzip,gzip');
    for (const n of [4, 3000]) {
      codings = n;
      const at = performance.now();
      const refused = await request(`${gw.url}/seo/v3/x`, { headers: auth });
      assert.equal(refused.status, 502, `${n} codings`);
      assert.deepEqual(refused.json(), { error: 'The upstream answered in a content coding the gateway cannot inspect.', code: 'upstream_unreachable' });
      assert.ok(performance.now() - at < 5_000, 'refused without decoding');
    }
  } finally {
    await gw.close();
    await up.close();
  }
});
