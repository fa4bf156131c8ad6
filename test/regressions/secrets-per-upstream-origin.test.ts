// Design §12 as changed (docs/security.md, "What each answer is scanned
// for"): an answer is scanned for the secrets sent to its upstream's origin,
// every credential of every route on it, and nothing else. Routes that share
// an origin share a table, so each masks the other's secrets, in the body,
// in a header and compressed; a secret never sent to an origin is not looked
// for in its answers (the voice provider never received the SEO password).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import zlib from 'node:zlib';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream, type Handler } from '../support/upstream.ts';

/** Answers with `text`, plain or gzip, and puts it in a header too. */
const answering =
  (text: () => string): Handler =>
  (req, res) => {
    req.resume();
    req.on('end', () => {
      const body = Buffer.from(`{"echo":"${text()}"}`);
      const gzip = req.url?.includes('gzip') === true;
      const out = gzip ? zlib.gzipSync(body) : body;
      res.writeHead(200, {
        'content-type': 'application/json',
        'content-length': out.length,
        'x-echo': text(),
        ...(gzip ? { 'content-encoding': 'gzip' } : {}),
      });
      res.end(out);
    });
  };

test("two routes on one origin: each masks the other's secrets, every credential, in body, header and compressed body", async () => {
  let echo = '';
  const up = await startUpstream(answering(() => echo));
  const tag = Math.random().toString(36).slice(2, 10);
  const gw = await startGateway({
    seo: up.url,
    speech: up.url,
    env: { KEYWARD_SPEECH_KEY_2: `sk_SECONDKEY${tag}`, KEYWARD_SEO_LOGIN_2: `second${tag}@example.com`, KEYWARD_SEO_PASSWORD_2: `pw_SECOND${tag}` },
  });
  try {
    const get = (path: string) => request(`${gw.url}${path}`, { headers: { authorization: `Bearer ${gw.token}` } });
    for (const [secret, via] of [
      [gw.secrets.seoPassword, '/speech/v1/voices'],
      [`pw_SECOND${tag}`, '/speech/v1/voices'],
      [gw.secrets.speechKey, '/seo/v3/x'],
      [`sk_SECONDKEY${tag}`, '/seo/v3/x'],
    ] as const) {
      echo = secret;
      const r = await get(via);
      assert.equal(r.status, 200);
      assert.ok(!r.body.toString().includes(secret), `${via}: the body holds no secret sent to its origin`);
      assert.ok(r.body.toString().includes('*'.repeat(secret.length)), `${via}: masked in place`);
      assert.ok(!String(r.headers['x-echo']).includes(secret), `${via}: the header holds none either`);
      // Compressed: a secret found decoded is never released (the answer is cut).
      const z = await get(`${via}?gzip=1`).catch(() => null);
      assert.ok(z === null || !zlib.gunzipSync(z.body, { finishFlush: zlib.constants.Z_SYNC_FLUSH }).toString().includes(secret), `${via}: compressed`);
    }
  } finally {
    await gw.close();
    await up.close();
  }
});

test('routes on origins of their own: an answer is scanned for its own origin’s secrets only', async () => {
  let echo = '';
  const speech = await startUpstream(answering(() => echo));
  const seo = await startUpstream(answering(() => echo));
  const gw = await startGateway({ seo: seo.url, speech: speech.url });
  try {
    const get = (path: string) => request(`${gw.url}${path}`, { headers: { authorization: `Bearer ${gw.token}` } });
    // Its own secret: masked.
    echo = gw.secrets.speechKey;
    assert.ok(!(await get('/speech/v1/voices')).body.toString().includes(gw.secrets.speechKey));
    // One the voice provider was never sent (it cannot have it to echo): not looked for, the body unchanged.
    echo = gw.secrets.seoPassword;
    const other = await get('/speech/v1/voices');
    assert.equal(other.body.toString(), `{"echo":"${gw.secrets.seoPassword}"}`);
    // And the other way round.
    assert.ok(!(await get('/seo/v3/x')).body.toString().includes(gw.secrets.seoPassword));
  } finally {
    await gw.close();
    await speech.close();
    await seo.close();
  }
});
