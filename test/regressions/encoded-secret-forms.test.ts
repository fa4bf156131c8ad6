// Encoded forms reached the client readable: percent-encoded (`%61%70…`,
// `apify%5Fapi%5F…`), JSON `\u` escapes, the SEO password in another letter
// case, the Basic credential percent-encoded (`…%3D%3D`) or with PHP's `\/`,
// base64 of the key in `Set-Cookie`, the key upper-cased, in UTF-16LE, or as
// HTML entities. Each is now masked, in bodies and headers, split anywhere
// across chunks (docs/security.md, "Each form a secret can take").
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

const pct = (s: string, upper = false): string => {
  const encoded = [...s].map((c) => `%${c.charCodeAt(0).toString(16)}`).join('');
  return upper ? encoded.toUpperCase() : encoded;
};

test('every encoded form of every secret is masked in the body, whole, however it is chunked; and in headers', async () => {
  let spelled: Buffer = Buffer.alloc(0);
  let cookie = '';
  const up = await startRawUpstream(() => {
    // The spelled secret between clean text, in 3-byte chunks (chunked framing).
    const body = Buffer.concat([Buffer.from('{"echo":"'), spelled, Buffer.from('"}')]);
    const chunks: string[] = [];
    for (let i = 0; i < body.length; i += 3) {
      const c = body.subarray(i, i + 3);
      chunks.push(`${c.length.toString(16)}\r\n${c.toString('latin1')}\r\n`);
    }
    return Buffer.from(
      `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nset-cookie: ${cookie}\r\ntransfer-encoding: chunked\r\n\r\n${chunks.join('')}0\r\n\r\n`,
      'latin1',
    );
  });
  const gw = await startGateway({ scraper: up.url, seo: up.url, speech: up.url });
  try {
    const { scraperToken: token, seoLogin, seoPassword, speechKey } = gw.secrets;
    const basic = Buffer.from(`${seoLogin}:${seoPassword}`).toString('base64');
    const forms: Array<[string, Buffer]> = [
      ['token percent-encoded', Buffer.from(pct(token))],
      ['token percent-encoded, upper hex', Buffer.from(pct(token, true))],
      ['token with %5F', Buffer.from(token.replace(/_/g, '%5F'))],
      ['token with \\u escapes', Buffer.from([...token].map((c) => `\\u00${c.charCodeAt(0).toString(16)}`).join(''))],
      ['token with \\u005f', Buffer.from(token.replace(/_/g, '\\u005f'))],
      ['token upper case', Buffer.from(token.toUpperCase())],
      ['token as HTML entities', Buffer.from([...token].map((c) => `&#${c.charCodeAt(0)};`).join(''))],
      ['token in UTF-16LE', Buffer.from(token, 'utf16le')],
      [
        'speech key mixed',
        Buffer.from([...speechKey].map((c, i) => (i % 3 === 0 ? `%${c.charCodeAt(0).toString(16)}` : i % 3 === 1 ? c.toUpperCase() : c)).join('')),
      ],
      ['seo password, other case', Buffer.from(seoPassword.toUpperCase())],
      ['seo basic with %3D', Buffer.from(basic.replace(/=/g, '%3D'))],
      ['seo basic with \\/', Buffer.from(basic.replace(/\//g, '\\/').replace(/=/g, '\\u003d'))],
    ];
    for (const [name, form] of forms) {
      spelled = form;
      cookie = `s=${Buffer.from(`{"k":"${speechKey}"}`).toString('base64')}; Path=/`;
      const r = await request(`${gw.url}/speech/v1/user`, { headers: { authorization: `Bearer ${gw.token}` } });
      assert.equal(r.status, 200, name);
      const body = r.body.toString('latin1');
      assert.equal(body.length, form.length + '{"echo":""}'.length, `${name}: same length`);
      const echoed = body.slice('{"echo":"'.length, body.length - 2);
      // (UTF-16's NUL after the last character is no part of the secret.)
      assert.match(echoed.replace(/\0$/, '*'), /^\*+$/, `${name}: ${JSON.stringify(echoed)}`);
      const set = String(r.headers['set-cookie']);
      assert.ok(
        !Buffer.from(set.slice(2, set.indexOf(';')).replace(/\*/g, 'A'), 'base64')
          .toString('latin1')
          .includes(speechKey),
        `${name}: the cookie's base64 decodes to the key`,
      );
    }
  } finally {
    await gw.close();
    await up.close();
  }
});
