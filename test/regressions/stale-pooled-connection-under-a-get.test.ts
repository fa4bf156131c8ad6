// A pooled upstream connection closed by the upstream while idle turned a GET
// into a 502 (docs/security.md, "Upstream connections"): a bodiless GET is
// sent once more on a fresh connection; a POST never is.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { CLOSE, startRawUpstream } from '../support/raw-upstream.ts';

test('a GET whose pooled connection was closed by the upstream is sent once more on a fresh one; a POST never is', async () => {
  // Answers the first request on each connection and closes the connection,
  // unanswered, when a second arrives on it: what an upstream's idle timeout
  // does to a request that races it.
  const up = await startRawUpstream((_head, _i, onConnection) => (onConnection === 0 ? 'HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok' : CLOSE));
  const gw = await startGateway({ seo: up.url, speech: up.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    for (let i = 0; i < 10; i++) {
      const r = await request(`${gw.url}/seo/v3/x${i}`, { headers: auth });
      assert.equal(r.status, 200, `GET ${i}`);
    }
    // Every request after the first met a closed pooled connection, then succeeded on a fresh one.
    assert.equal(up.heads.filter((h) => h.startsWith('GET')).length, 19);
    const before = up.heads.length;
    const post = await request(`${gw.url}/seo/v3/p`, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: '{}' });
    assert.equal(post.status, 502, 'a request with a body is never sent twice');
    assert.equal(up.heads.length - before, 1, 'the upstream saw the POST once');
  } finally {
    await gw.close();
    await up.close();
  }
});
