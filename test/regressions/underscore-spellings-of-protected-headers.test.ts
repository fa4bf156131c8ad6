// Hardening, round 2. CGI-style stacks (WSGI, Rack, PHP) read `xi_api_key`
// and `xi-api-key`, or `x_http_method_override` and its dashed form, as the
// same variable (docs/routes.md): protected headers are matched with `_` as
// `-`, credentials removed and method overrides refused in any spelling.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('protected headers are matched with `_` as `-`: credentials in any spelling removed, method overrides in any spelling refused', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ speech: up.url, seo: up.url });
  try {
    const override = await raw(
      gw.port,
      `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nX_HTTP_Method_Override: DELETE\r\ncontent-length: 0\r\nconnection: close\r\n\r\n`,
    );
    assert.match(override, /^HTTP\/1\.1 404 /);
    assert.match(override, /"error":"Method overrides are not allowed\."/);
    assert.equal(up.requests.length, 0);
    const sent = await raw(
      gw.port,
      `GET /speech/v1/user HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nxi_api_key: client-supplied\r\nXI_API_KEY: other\r\ncontent_length: 5\r\nkeep_alive: x\r\nx_custom: kept\r\nconnection: close\r\n\r\n`,
    );
    assert.match(sent, /^HTTP\/1\.1 200 /);
    const seen = up.requests[0] as { headers: Record<string, string | string[] | undefined> };
    assert.equal(seen.headers['xi-api-key'], gw.secrets.speechKey, 'only the injected credential');
    for (const h of ['xi_api_key', 'content_length', 'keep_alive']) assert.equal(seen.headers[h], undefined, h);
    assert.equal(seen.headers.x_custom, 'kept', 'other underscore names pass');
  } finally {
    await gw.close();
    await up.close();
  }
});
