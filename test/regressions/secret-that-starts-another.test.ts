// A secret that is the start of another one on the same origin (two scraper
// tokens, the second the first plus more): the scan held the shorter one at
// the end of a body as the possible start of the longer, and at the body's
// end released what it held unscanned, so an answer ending with the shorter
// token carried it to the client. Found by the per-origin property test
// (test/property/egress.test.ts). Now the held tail is scanned at the end
// (docs/security.md, "How the scan reads a body").
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('an answer that ends with a secret which starts another secret of its origin has it masked, whatever the chunks', async () => {
  const tag = Math.random().toString(36).slice(2, 10);
  const short = `apify_api_prefix${tag}`;
  const long = `${short}MORE`;
  let body = '';
  const up = await startUpstream((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/plain' });
      // Byte by byte, then whole: the tail is held across chunks either way.
      if (req.url?.includes('trickle') === true) {
        const bytes = Buffer.from(body);
        let i = 0;
        const next = (): void => {
          if (i >= bytes.length) return void res.end();
          res.write(bytes.subarray(i, ++i), next);
        };
        next();
      } else res.end(body);
    });
  });
  const gw = await startGateway({ scraper: up.url, secrets: { scraper: [long] }, env: { KEYWARD_SCRAPER_TOKEN_2: short } });
  try {
    for (const ending of [short, ` x ${long} x ${short}`, `${short}${short}`]) {
      body = `{"note":"the token is"} ${ending}`;
      for (const path of ['/scraper/v2/acts/x/runs', '/scraper/v2/acts/x/runs?trickle=1']) {
        const r = await request(`${gw.url}${path}`, { method: 'POST', headers: { authorization: `Bearer ${gw.token}` }, body: '{}' });
        const text = r.body.toString('latin1');
        assert.equal(r.body.length, Buffer.byteLength(body), 'same length: masked in place');
        assert.ok(!text.includes(short), `${path}: ${JSON.stringify(text)} holds the shorter token`);
        assert.ok(text.endsWith('*'.repeat(short.length)), `${path}: its end is masked`);
      }
    }
  } finally {
    await gw.close();
    await up.close();
  }
});
