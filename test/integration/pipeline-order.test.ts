// The order of the pipeline's steps (ARCHITECTURE.md, the request path):
// a request that several steps would refuse gets the earliest step's
// answer, over real sockets, and nothing reaches the upstream.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

const status = (out: string): string => /^HTTP\/1\.1 (\d{3})/.exec(out)?.[1] ?? out.slice(0, 40);
const code = (out: string): string => /"code":"([a-z_]+)"/.exec(out)?.[1] ?? '';

test('authentication before Expect, Expect before routing, routing before the guards, the guards in their order', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, speech: up.url });
  try {
    const send = async (head: string): Promise<[string, string]> => {
      const out = await raw(gw.port, `${head}\r\nhost: x\r\nconnection: close\r\n\r\n`);
      return [status(out), code(out)];
    };
    const auth = `authorization: Bearer ${gw.token}`;
    // No token, unknown path, odd Expect: 401 (authentication first).
    assert.deepEqual(await send('PUT /nowhere HTTP/1.1\r\nexpect: 200-ok'), ['401', 'unauthorized']);
    // Token, unknown path, odd Expect: 417 (the expectation before routing).
    assert.deepEqual(await send(`PUT /nowhere HTTP/1.1\r\n${auth}\r\nexpect: 200-ok`), ['417', 'expectation_failed']);
    // Token, unknown path, a method override: 404 from routing.
    assert.deepEqual(await send(`PUT /nowhere HTTP/1.1\r\n${auth}\r\nx-http-method-override: GET`), ['404', 'not_found']);
    // A routed request with a method override and a body too large: the override (earlier guard).
    assert.deepEqual(await send(`POST /seo/v3/x HTTP/1.1\r\n${auth}\r\nx-http-method-override: DELETE\r\ncontent-length: 99999999999`), ['404', 'not_found']);
    // Without the override: the size.
    assert.deepEqual(await send(`POST /seo/v3/x HTTP/1.1\r\n${auth}\r\ncontent-length: 99999999999`), ['413', 'payload_too_large']);
    assert.equal(up.requests.length, 0, 'nothing forwarded');
  } finally {
    await gw.close();
    await up.close();
  }
});
