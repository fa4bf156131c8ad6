// The providers' official SDKs as real clients (docs/keys.md, native credentials): each is pointed
// at the gateway by its base URL, once presenting the client token where the
// SDK puts its own key (KEYWARD_NATIVE_AUTH) and once as a Bearer token.
// The recording upstreams check what arrived; the SDKs check what came back.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ElevenLabsClient } from '@elevenlabs/elevenlabs-js';
import { ApifyClient } from 'apify-client';
import * as dataforseo from 'dataforseo-client';
import { request } from '../support/client.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { startUpstream, type MockUpstream } from '../support/upstream.ts';

const AUDIO = Buffer.from(Array.from({ length: 4096 }, (_, i) => (i * 31) & 0xff));

async function upstreams(): Promise<{ scraper: MockUpstream; seo: MockUpstream; speech: MockUpstream; close(): Promise<void> }> {
  const scraper = await startUpstream((req, res, rec) => {
    req.on('end', () => {
      const body = JSON.stringify({
        data: {
          id: 'run-1',
          actId: rec.url.split('/')[3],
          status: 'READY',
          startedAt: '2026-01-01T00:00:00.000Z',
          input: JSON.parse(rec.body.toString() || '{}'),
        },
      });
      res.writeHead(201, { 'content-type': 'application/json' }).end(body);
    });
  });
  const seo = await startUpstream((req, res) => {
    req.on('end', () => {
      const body = JSON.stringify({
        version: '0.1.20260101',
        status_code: 20000,
        status_message: 'Ok.',
        time: '0.01 sec.',
        cost: 0,
        tasks_count: 1,
        tasks_error: 0,
        tasks: [{ id: 't-1', status_code: 20000, status_message: 'Ok.', result: [{ login: 'demo', money: { balance: 42.5 } }] }],
      });
      res.writeHead(200, { 'content-type': 'application/json' }).end(body);
    });
  });
  const speech = await startUpstream((req, res) => {
    req.on('end', () => res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': '5' }).end(AUDIO));
  });
  return { scraper, seo, speech, close: async () => void (await Promise.all([scraper.close(), seo.close(), speech.close()])) };
}

function fetchWithHeader(name: string, value: string): typeof fetch {
  return (url, init) => fetch(url, { ...init, headers: { ...(init?.headers as Record<string, string>), [name]: value } });
}

async function readAll(stream: ReadableStream<Uint8Array>): Promise<Buffer> {
  const chunks: Buffer[] = [];
  for await (const c of stream as unknown as AsyncIterable<Uint8Array>) chunks.push(Buffer.from(c));
  return Buffer.concat(chunks);
}

function assertClean(gw: TestGateway, up: MockUpstream, credential: RegExp): void {
  const wire = up.raw().toString('latin1');
  assert.equal(wire.includes(gw.token), false, 'the client token never reached the upstream');
  assert.equal(wire.toLowerCase().includes(gw.token.toLowerCase()), false);
  assert.match(wire, credential);
}

for (const mode of ['native', 'bearer'] as const) {
  test(`the three SDKs complete real calls through the gateway (${mode === 'native' ? 'token where the SDK puts its key' : 'Authorization: Bearer'})`, async () => {
    const ups = await upstreams();
    const gw = await startGateway({
      scraper: ups.scraper.url,
      seo: ups.seo.url,
      speech: ups.speech.url,
      env: mode === 'native' ? { KEYWARD_NATIVE_AUTH: 'speech,seo,scraper' } : {},
    });
    try {
      // Apify: the client always sends its token as a Bearer header, so only the base URL changes in both modes.
      const apify = new ApifyClient({ token: gw.token, baseUrl: `${gw.url}/scraper`, maxRetries: 0 });
      const run = await apify.actor('apify~web-scraper').start({ startUrls: [{ url: 'https://example.com' }] });
      assert.equal(run.id, 'run-1');
      assert.equal(run.status, 'READY');
      const sent = ups.scraper.requests[0];
      assert.equal(sent?.method, 'POST');
      assert.match(sent?.url ?? '', /^\/v2\/act(or)?s\/apify~web-scraper\/runs/);
      assert.equal(sent?.headers.authorization, `Bearer ${gw.secrets.scraperToken}`);
      assert.deepEqual(JSON.parse(sent?.body.toString() ?? ''), { startUrls: [{ url: 'https://example.com' }] });
      assertClean(gw, ups.scraper, new RegExp(`authorization: Bearer ${gw.secrets.scraperToken}`, 'i'));

      // ElevenLabs: its key goes in xi-api-key (native); or a Bearer header through its `headers` option.
      const eleven =
        mode === 'native'
          ? new ElevenLabsClient({ baseUrl: `${gw.url}/speech`, apiKey: gw.token, maxRetries: 0 })
          : new ElevenLabsClient({ baseUrl: `${gw.url}/speech`, apiKey: '', headers: { authorization: `Bearer ${gw.token}` }, maxRetries: 0 });
      const audio = await readAll(await eleven.textToSpeech.convert('21m00Tcm4TlvDq8ikWAM', { text: 'Hello', modelId: 'eleven_multilingual_v2' }));
      assert.deepEqual(audio, AUDIO, 'audio byte for byte');
      const tts = ups.speech.requests[0];
      assert.equal(tts?.method, 'POST');
      assert.match(tts?.url ?? '', /^\/v1\/text-to-speech\/21m00Tcm4TlvDq8ikWAM/);
      assert.equal(tts?.headers['xi-api-key'], gw.secrets.speechKey);
      assert.equal(tts?.headers.authorization, undefined);
      assert.equal(JSON.parse(tts?.body.toString() ?? '').text, 'Hello');
      assertClean(gw, ups.speech, new RegExp(`xi-api-key: ${gw.secrets.speechKey}`, 'i'));

      // DataForSEO: its documented setup is a fetch that adds HTTP Basic (any login, the token as password), or Bearer.
      const auth = mode === 'native' ? `Basic ${Buffer.from(`any-login:${gw.token}`).toString('base64')}` : `Bearer ${gw.token}`;
      const appendix = new dataforseo.AppendixApi(`${gw.url}/seo`, { fetch: fetchWithHeader('Authorization', auth) });
      const user = await appendix.userData();
      assert.equal(user?.status_code, 20000);
      assert.equal(user?.tasks?.[0]?.result?.[0]?.login, 'demo');
      const got = ups.seo.requests[0];
      assert.equal(got?.method, 'GET');
      assert.equal(got?.url, '/v3/appendix/user_data');
      assert.equal(got?.headers.authorization, `Basic ${Buffer.from(`${gw.secrets.seoLogin}:${gw.secrets.seoPassword}`).toString('base64')}`);
      assertClean(gw, ups.seo, /authorization: Basic /i);

      // What the SDKs' calls left in the log: the key, never the token.
      assert.equal(gw.logText().includes(gw.token), false);
      assert.equal(gw.logs().filter((l) => l.msg === 'request completed' && l.keyName === 'tester').length, 3);
    } finally {
      await gw.close();
      await ups.close();
    }
  });
}

test('native credentials: taken only on listed routes, removed like a Bearer token, and a wrong one is 401', async () => {
  const ups = await upstreams();
  const gw = await startGateway({ scraper: ups.scraper.url, seo: ups.seo.url, speech: ups.speech.url, env: { KEYWARD_NATIVE_AUTH: 'scraper,speech' } });
  try {
    // ?token= on the scraper route (the platform's own query credential)
    const r = await request(`${gw.url}/scraper/v2/acts/a~b/runs?token=${gw.token}&timeout=60`, { method: 'POST', body: '{}' });
    assert.equal(r.status, 201);
    assert.equal(ups.scraper.requests[0]?.url, '/v2/acts/a~b/runs?timeout=60');
    // xi-api-key on speech
    assert.equal((await request(`${gw.url}/speech/v1/voices`, { headers: { 'xi-api-key': gw.token } })).status, 200);
    // Basic on seo is not listed here: refused
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Basic ${Buffer.from(`x:${gw.token}`).toString('base64')}` } })).status, 401);
    // a native header on another route is no credential there
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { 'xi-api-key': gw.token } })).status, 401);
    // a wrong native credential is refused like a wrong Bearer token
    assert.equal((await request(`${gw.url}/speech/v1/voices`, { headers: { 'xi-api-key': 'sk_not_a_keyward_token' } })).status, 401);
    for (const up of [ups.scraper, ups.speech]) assert.equal(up.raw().toString('latin1').includes(gw.token), false);
    assert.equal(ups.seo.requests.length, 0);
  } finally {
    await gw.close();
    await ups.close();
  }
});
