// Forwarded as ordinary parameters: `token%00=`, `;token=`, `+token=`,
// `token%20=` on the scraper route and `xi-api-key%20=` on speech, each of
// which some common server reads as the credential parameter (PHP cuts a
// name at NUL and drops its leading spaces; Rack before 3 and Python before
// 3.9.2 split on `;`). Such a request is now refused with 400 before
// anything is forwarded; a spelling no common parser reads as the
// credential (`token.=`, `tokens=`) is forwarded as it is (docs/routes.md).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('a query parameter a lenient upstream parser reads as the credential is refused; other spellings pass unchanged', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ scraper: up.url, speech: up.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    const refused: Array<[string, string]> = [
      ['POST', '/scraper/v2/acts/x/runs?token%00=abc'],
      ['POST', '/scraper/v2/acts/x/runs?a=1;token=abc'],
      ['POST', '/scraper/v2/acts/x/runs?+token=abc'],
      ['POST', '/scraper/v2/acts/x/runs?token%20=abc'],
      ['POST', '/scraper/v2/acts/x/runs?%09TOKEN=abc'],
      ['GET', '/speech/v1/voices?xi-api-key%20=abc'],
      ['GET', '/speech/v1/voices?x=1;xi-api-key=abc'],
    ];
    for (const [method, path] of refused) {
      const r = await request(`${gw.url}${path}`, { method, headers: auth, ...(method === 'POST' ? { body: '{}' } : {}) });
      assert.equal(r.status, 400, path);
      assert.deepEqual(r.json(), { error: 'A query parameter an upstream could read as its credential is not allowed.', code: 'bad_request' }, path);
    }
    assert.equal(up.requests.length, 0, 'none forwarded');
    // The override parameter read the same way: refused as an override.
    const override = await request(`${gw.url}/scraper/v2/acts/x/runs?a=1;method=DELETE`, { method: 'POST', headers: auth, body: '{}' });
    assert.equal(override.status, 404);
    // No common parser reads these as the credential: forwarded byte for byte.
    for (const q of ['token.=abc', 'tokens=abc', 'my_token=abc', 'a=token']) {
      const r = await request(`${gw.url}/scraper/v2/acts/x/runs?${q}`, { method: 'POST', headers: auth, body: '{}' });
      assert.equal(r.status, 200, q);
      assert.equal(up.requests.at(-1)?.url, `/v2/acts/x/runs?${q}`);
    }
  } finally {
    await gw.close();
    await up.close();
  }
});
