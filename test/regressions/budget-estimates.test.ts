// A budget on a route whose cost comes in the answer reserved an estimate
// learnt from every call: answers that reported no cost (a 404, an error)
// taught it 0, and cheap calls of any key talked it down, so many dear
// calls sent at once all passed at nearly nothing. Now only a reported cost
// teaches, and no estimate is below the dearest call the route reported in
// the period (docs/limits.md, "Reserved at admission"). One gateway, real
// sockets, an upstream that answers per path: `dear` costs 0.3 USD (SEO, the
// body's `cost`) or 300 characters (speech, the `character-cost` header),
// `cheap` 0.001 or 1, `fail` a 404 that reports nothing.
import assert from 'node:assert/strict';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';
import { createKey } from '../../src/keys/manage.ts';

function priced(req: IncomingMessage, res: ServerResponse): void {
  req.resume();
  const url = req.url ?? '';
  const speech = url.startsWith('/v1/');
  if (url.includes('fail')) {
    res.writeHead(404, { 'content-type': 'application/json' });
    return void res.end('{"error":"not found"}');
  }
  const dear = url.includes('dear');
  if (speech) {
    res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': dear ? '300' : '1' });
    // The dear ones take a moment: they overlap.
    return void setTimeout(() => res.end('mp3'), dear ? 300 : 0);
  }
  res.writeHead(200, { 'content-type': 'application/json' });
  setTimeout(() => res.end(`{"status_code":20000,"cost":${dear ? 0.3 : 0.001},"tasks":[]}`), dear ? 300 : 0);
}

const auth = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` });
const call = async (gw: TestGateway, token: string, path: string): Promise<number> =>
  (await request(`${gw.url}${path}`, { method: 'POST', headers: auth(token), body: '{}', timeoutMs: 20_000 })).status;

async function liveKey(gw: TestGateway, name: string, budget: string): Promise<string> {
  const { token } = await createKey(gw.store, name, { limits: { budgets: { [budget.split('=')[0] as string]: budget.split('=')[1] as string } } });
  await eventually(async () => (await request(`${gw.url}/keyward/key`, { headers: auth(token) })).status === 200, 10_000, `key ${name} served`);
  return token;
}

for (const [route, budget, dearCost, base] of [
  ['seo', '1/day', 0.3, '/seo/v3/serp'],
  ['speech', '1000/day', 300, '/speech/v1/text-to-speech'],
] as const) {
  test(`${route}: 30 failing calls teach nothing; 50 dear ones at once then pass at most ⌈budget / cost⌉`, async () => {
    const up = await startUpstream(priced);
    const gw = await startGateway({ [route]: up.url, limits: { budgets: { [route]: budget } } });
    try {
      for (let i = 0; i < 30; i++) assert.equal(await call(gw, gw.token, `${base}/fail`), 404);
      const statuses = await Promise.all(Array.from({ length: 50 }, () => call(gw, gw.token, `${base}/dear`)));
      const forwarded = statuses.filter((s) => s === 200).length;
      const bound = Math.ceil(Number(budget.split('/')[0]) / dearCost);
      assert.ok(forwarded >= 1 && forwarded <= bound, `${forwarded} forwarded (bound ${bound}): ${statuses.join(',')}`);
      console.log(`${route}: 30 failing, then 50 dear at once: ${forwarded} forwarded (bound ${bound})`);
    } finally {
      await gw.close();
      await up.close();
    }
  });

  test(`${route}: a dear call seen, then 30 cheap calls of another key: a new key's 50 dear calls at once still reserve the dear cost`, async () => {
    const up = await startUpstream(priced);
    const gw = await startGateway({ [route]: up.url, limits: { budgets: { [route]: budget } } });
    try {
      assert.equal(await call(gw, gw.token, `${base}/dear`), 200);
      const cheap = await liveKey(gw, 'cheap', `${route}=${budget}`);
      for (let i = 0; i < 30; i++) assert.equal(await call(gw, cheap, `${base}/cheap`), 200);
      const fresh = await liveKey(gw, 'fresh', `${route}=${budget}`);
      const statuses = await Promise.all(Array.from({ length: 50 }, () => call(gw, fresh, `${base}/dear`)));
      const forwarded = statuses.filter((s) => s === 200).length;
      const bound = Math.ceil(Number(budget.split('/')[0]) / dearCost);
      assert.ok(forwarded >= 1 && forwarded <= bound, `${forwarded} forwarded (bound ${bound}): ${statuses.join(',')}`);
      // The key's own cheap calls cannot talk it down either.
      const statusesOwn = await Promise.all(Array.from({ length: 50 }, () => call(gw, cheap, `${base}/dear`)));
      assert.ok(statusesOwn.filter((s) => s === 200).length <= bound);
      console.log(`${route}: dear, 30 cheap of another key, then 50 dear of a new key at once: ${forwarded} forwarded (bound ${bound})`);
    } finally {
      await gw.close();
      await up.close();
    }
  });
}
