// Upstream response heads larger than Node's 16 KiB default were a 502
// (docs/security.md, "Upstream connections"): heads up to
// KEYWARD_UPSTREAM_MAX_HEADER_SIZE are relayed, larger ones are a 502.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import http from 'node:http';
import { type Reply } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

/** A GET whose client accepts large response heads (Node's own default stops at 16 KiB). */
function getLarge(url: string, token: string): Promise<Reply> {
  return new Promise((resolve, reject) => {
    const req = http
      .get(url, { headers: { authorization: `Bearer ${token}` }, agent: false, maxHeaderSize: 1024 * 1024 }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const body = Buffer.concat(chunks);
          resolve({
            status: res.statusCode as number,
            headers: res.headers,
            rawHeaders: res.rawHeaders,
            body,
            json: () => JSON.parse(body.toString()) as unknown,
          });
        });
      })
      .on('error', reject);
    req.maxHeadersCount = 0;
  });
}

test('upstream response heads up to KEYWARD_UPSTREAM_MAX_HEADER_SIZE (64 KiB by default) are relayed; larger ones are a 502', async () => {
  const big = 'v'.repeat(40 * 1024);
  const cookies = Array.from({ length: 2_000 }, (_, i) => `set-cookie: c${i}=${'x'.repeat(12)}\r\n`).join('');
  const heads = [`x-big: ${big}\r\n`, cookies, `x-huge: ${'v'.repeat(80 * 1024)}\r\n`];
  const up = await startRawUpstream((_head, i) => `HTTP/1.1 200 OK\r\n${heads[i % heads.length] as string}content-length: 2\r\n\r\nok`);
  const gw = await startGateway({ seo: up.url });
  const gw2 = await startGateway({ seo: up.url, env: { KEYWARD_UPSTREAM_MAX_HEADER_SIZE: '128KiB' } });
  try {
    const one = await getLarge(`${gw.url}/seo/v3/a`, gw.token);
    assert.equal(one.status, 200);
    assert.equal(one.headers['x-big'], big);
    const many = await getLarge(`${gw.url}/seo/v3/b`, gw.token);
    assert.equal(many.status, 200);
    assert.equal((many.headers['set-cookie'] ?? []).length, 2_000);
    const huge = await getLarge(`${gw.url}/seo/v3/c`, gw.token);
    assert.equal(huge.status, 502);
    // Raised, the same 80 KiB header passes.
    await sleep(0);
    const raised = await getLarge(`${gw2.url}/seo/v3/c`, gw2.token);
    assert.equal(raised.status, 200);
  } finally {
    await gw.close();
    await gw2.close();
    await up.close();
  }
});
