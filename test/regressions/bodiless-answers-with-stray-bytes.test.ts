// 204 and 304 answers followed by stray bytes (docs/security.md, "Upstream
// connections"): the client gets the status, and the connection that
// carried the stray bytes is not reused.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import http from 'node:http';
import { request } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startRawUpstream } from '../support/raw-upstream.ts';

test('204 and 304 answers followed by stray bytes reach the client with their status; the connection is not reused', async () => {
  const replies = [
    'HTTP/1.1 204 No Content\r\n\r\nSTRAY BYTES',
    'HTTP/1.1 304 Not Modified\r\netag: "a"\r\n\r\n<html>stray</html>',
    'HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello',
  ];
  const up = await startRawUpstream((_head, i) => replies[i % replies.length] as string);
  const gw = await startGateway({ seo: up.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const a = await request(`${gw.url}/seo/v3/a`, { headers: auth, agent });
    assert.equal(a.status, 204);
    const b = await request(`${gw.url}/seo/v3/b`, { headers: auth, agent });
    assert.equal(b.status, 304);
    assert.equal(b.headers.etag, '"a"');
    const c = await request(`${gw.url}/seo/v3/c`, { headers: auth, agent });
    assert.equal(c.body.toString(), 'hello');
    agent.destroy();
    assert.equal(up.connections(), 3, 'a connection that sent stray bytes is never used again');
    assert.equal(gw.logs().filter((l) => l.msg === 'request completed' && l.error !== null).length, 0);
  } finally {
    await gw.close();
    await up.close();
  }
});
