// No master secret reaches a client (docs/security.md, "Upstream secrets
// never reach a client"): an upstream that echoes its credential — in a
// user object, a header, an error body, split across writes, or compressed —
// never gets it past the gateway.
import { once } from 'node:events';
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import zlib from 'node:zlib';
import http from 'node:http';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { parseProm } from '../support/prom.ts';
import { startUpstream, type Handler } from '../support/upstream.ts';

const b64 = (s: string): string => Buffer.from(s).toString('base64');
const every = (gw: TestGateway): string[] => [
  gw.secrets.scraperToken,
  gw.secrets.seoPassword,
  b64(`${gw.secrets.seoLogin}:${gw.secrets.seoPassword}`),
  gw.secrets.speechKey,
];

async function withUpstream(handler: Handler, run: (gw: TestGateway) => Promise<void>, env: Record<string, string> = {}): Promise<void> {
  const up = await startUpstream(handler);
  const gw = await startGateway({ seo: up.url, speech: up.url, scraper: up.url, env });
  try {
    await run(gw);
  } finally {
    await gw.close();
    await up.close();
  }
}

/** Answers with whatever `body(secret headers the upstream received)` returns, written in pieces of `piece` bytes. */
const echoing =
  (body: (req: http.IncomingMessage) => string, extra: (req: http.IncomingMessage) => Record<string, string> = () => ({}), piece = 0): Handler =>
  async (req, res) => {
    req.resume();
    await once(req, 'end');
    const text = Buffer.from(body(req));
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': text.length, ...extra(req) });
    if (piece === 0) return res.end(text);
    for (let i = 0; i < text.length; i += piece) {
      res.write(text.subarray(i, i + piece));
      await sleep(1);
    }
    res.end();
  };

test("the speech user object's xi_api_key, and a credential echoed in a header or an error body, reach the client masked, same length", async () => {
  await withUpstream(
    echoing(
      (req) =>
        JSON.stringify({ subscription: { tier: 'pro' }, xi_api_key: req.headers['xi-api-key'] ?? null, auth: req.headers.authorization ?? null, note: 'ok' }),
      (req) => ({ 'x-echo': String(req.headers['xi-api-key'] ?? req.headers.authorization ?? '') }),
    ),
    async (gw) => {
      const auth = { authorization: `Bearer ${gw.token}` };
      const user = await request(`${gw.url}/speech/v1/user`, { headers: auth });
      assert.equal(user.status, 200);
      const body = user.json() as { xi_api_key: string; note: string };
      assert.equal(body.xi_api_key, '*'.repeat(gw.secrets.speechKey.length));
      assert.equal(body.note, 'ok', 'the rest unchanged');
      assert.equal(Number(user.headers['content-length']), user.body.length, 'framing intact');
      assert.equal(user.headers['x-echo'], '*'.repeat(gw.secrets.speechKey.length));
      // The SEO credential in its base64 form (a header and a body).
      const seo = await request(`${gw.url}/seo/v3/x`, { headers: auth });
      assert.equal((seo.json() as { auth: string }).auth, `Basic ${'*'.repeat(b64(`${gw.secrets.seoLogin}:${gw.secrets.seoPassword}`).length)}`);
      for (const reply of [user, seo]) {
        const bytes = Buffer.concat([Buffer.from(reply.rawHeaders.join('\n')), reply.body]).toString('latin1');
        for (const secret of every(gw)) assert.equal(bytes.includes(secret), false);
      }
      // Logged at warn with the route, the path and which secret (route and form), never the value.
      await eventually(
        () => gw.logs().filter((l) => l.msg === 'upstream secret found in a response and kept from the client').length === 2,
        2_000,
        'two warnings',
      );
      const warned = gw.logs().filter((l) => l.msg === 'upstream secret found in a response and kept from the client');
      assert.deepEqual(
        warned.map((l) => [l.level, l.route, l.path, l.secrets]),
        [
          [40, 'speech', '/speech/v1/user', ['speech key']],
          [40, 'seo', '/seo/v3/x', ['seo basic']],
        ],
      );
      for (const secret of every(gw)) assert.equal(gw.logText().includes(secret), false);
      const m = parseProm(await gw.gateway.metrics.text());
      assert.equal(m.sum('keyward_egress_masked_total', { route: 'speech', secret: 'speech key' }), 1);
      assert.equal(m.sum('keyward_egress_masked_total', { route: 'seo', secret: 'seo basic' }), 1);
    },
  );
});

test('a secret split across many small writes (and the raw SEO password in an error body) is masked across every boundary', async () => {
  await withUpstream(
    echoing(
      (req) =>
        `{"error":"bad password ${req.headers.authorization === undefined ? '' : Buffer.from(String(req.headers.authorization).slice(6), 'base64').toString().split(':')[1]}","also":"${String(req.headers['xi-api-key'] ?? '')}"}`,
      () => ({}),
      1,
    ),
    async (gw) => {
      for (const path of ['/seo/v3/x', '/speech/v1/user']) {
        const r = await request(`${gw.url}${path}`, { headers: { authorization: `Bearer ${gw.token}` } });
        assert.equal(r.status, 200);
        for (const secret of every(gw)) assert.equal(r.body.includes(secret), false, path);
        assert.match(r.body.toString(), /^\{"error":"bad password \**","also":"\**"\}$/);
      }
      const seo = (await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).json() as { error: string };
      assert.equal(seo.error, `bad password ${'*'.repeat(gw.secrets.seoPassword.length)}`);
    },
  );
});

for (const [coding, encode, decode] of [
  ['gzip', zlib.gzipSync, zlib.gunzipSync],
  ['br', zlib.brotliCompressSync, zlib.brotliDecompressSync],
  ['deflate', zlib.deflateSync, zlib.inflateSync],
] as const) {
  test(`a ${coding} body echoing a secret is cut before the bytes that would complete it; a clean one passes intact`, async () => {
    const padding = 'x'.repeat(200_000);
    await withUpstream(
      async (req, res) => {
        req.resume();
        await once(req, 'end');
        const leak = req.url?.includes('leak') === true;
        const text = `${padding.slice(0, 100_000)}${leak ? String(req.headers['xi-api-key']) : 'nothing here'}${padding}`;
        const packed = encode(Buffer.from(text));
        res.writeHead(200, { 'content-type': 'text/plain', 'content-encoding': coding, 'content-length': packed.length });
        // In pieces, as a real upstream streams it.
        for (let i = 0; i < packed.length; i += 512) {
          res.write(packed.subarray(i, i + 512));
          await sleep(0);
        }
        res.end();
      },
      async (gw) => {
        const auth = { authorization: `Bearer ${gw.token}` };
        const clean = await request(`${gw.url}/speech/v1/clean`, { headers: auth });
        assert.equal(clean.status, 200);
        assert.equal(decode(clean.body).toString().includes('nothing here'), true, 'a clean body arrives whole');
        // The leaking one: the client gets a cut connection; what it did get decodes to no secret.
        const received: Buffer[] = [];
        const outcome = await new Promise<string>((resolve) => {
          http
            .get(`${gw.url}/speech/v1/leak`, { headers: auth, agent: false }, (res) => {
              res.on('data', (c: Buffer) => received.push(c));
              res.on('end', () => resolve('ended'));
              res.on('error', () => resolve('cut'));
              res.on('aborted', () => resolve('cut'));
            })
            .on('error', () => resolve('cut'));
        });
        assert.equal(outcome, 'cut');
        const partial = Buffer.concat(received);
        let decoded = '';
        const d = coding === 'gzip' ? zlib.createGunzip() : coding === 'br' ? zlib.createBrotliDecompress() : zlib.createInflate();
        d.on('data', (c: Buffer) => (decoded += c.toString('latin1')));
        // The decoder has read all it got: it ends, or fails on the cut.
        await deadline(
          new Promise<void>((resolve) => {
            d.on('end', resolve);
            d.on('error', () => resolve());
            d.end(partial);
          }),
          5_000,
          'the client-side decoder done',
        );
        assert.equal(decoded.includes(gw.secrets.speechKey), false);
        assert.equal(decoded.includes(gw.secrets.speechKey.slice(0, 4)), false, 'not even its start');
        await eventually(
          () => gw.logs().some((l) => l.msg === 'upstream secret found in a response and kept from the client' && l.cut === true),
          2_000,
          'warned',
        );
      },
    );
  });
}

test('a content coding the filter cannot read is refused with 502, and KEYWARD_EGRESS_FILTER=off relays everything as it is', async () => {
  const handler = echoing(
    (req) => String(req.headers['xi-api-key']),
    () => ({ 'content-encoding': 'compress' }),
  );
  await withUpstream(handler, async (gw) => {
    const r = await request(`${gw.url}/speech/v1/x`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(r.status, 502);
    assert.equal((r.json() as { code: string }).code, 'upstream_unreachable');
  });
  await withUpstream(
    handler,
    async (gw) => {
      const r = await request(`${gw.url}/speech/v1/x`, { headers: { authorization: `Bearer ${gw.token}` } });
      assert.equal(r.status, 200);
      assert.equal(r.body.toString(), gw.secrets.speechKey, 'off means off (for measuring its cost)');
    },
    { KEYWARD_EGRESS_FILTER: 'off' },
  );
});
