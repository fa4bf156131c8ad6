// Hardening, round 2. Paths with encoded control characters, `%u` escapes, overlong UTF-8 or dot
// segments with encoded blanks reached the upstream, where lenient stacks
// decode them (docs/routes.md): refused with 400 before forwarding.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('paths with encoded control characters, %u escapes, overlong UTF-8 or dots with encoded blanks are refused with 400 before forwarding', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  try {
    const refused = [
      '/seo/..%00/x',
      '/seo/..%20/x',
      '/seo/%c0%ae%c0%ae/x',
      '/seo/%C0%AF',
      '/seo/%u002e%u002e/x',
      '/seo/.%00./x',
      '/seo/a%0d%0aSet-Cookie:x',
      '/seo/a%7F',
      '/seo/%e0%80%af',
      '/seo/%f0%80%80%af',
      '/seo/%2e%09/x',
    ];
    for (const path of refused) {
      const out = await raw(gw.port, `GET ${path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nconnection: close\r\n\r\n`);
      assert.match(out, /^HTTP\/1\.1 400 /, path);
      assert.match(out, /"code":"bad_request"/, path);
    }
    assert.equal(up.requests.length, 0, 'none reached the upstream');
    // What stays allowed: ordinary escapes, encoded slashes, UTF-8, spaces inside names.
    for (const path of ['/seo/a%20b', '/seo/a%2Fb', '/seo/%e2%82%ac', '/seo/..%20x', '/seo/%41']) {
      const out = await raw(gw.port, `GET ${path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nconnection: close\r\n\r\n`);
      assert.match(out, /^HTTP\/1\.1 200 /, path);
    }
    assert.deepEqual(
      up.requests.map((r) => r.url),
      ['/a%20b', '/a%2Fb', '/%e2%82%ac', '/..%20x', '/%41'],
    );
  } finally {
    await gw.close();
    await up.close();
  }
});
