// docs/responses.md: the gateway's own errors, each with its status and stable code.
import assert from 'node:assert/strict';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { test } from 'node:test';
import { raw, request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

async function closedPort(): Promise<number> {
  const s = http.createServer();
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  const port = (s.address() as AddressInfo).port;
  await new Promise((r) => s.close(r));
  return port;
}

test('connection refused is 502 upstream_unreachable, logged at warn', async () => {
  // Another loopback address than the one the suite's servers listen on: a port freed here cannot be taken by another test's server.
  const gw = await startGateway({ seo: `http://127.0.0.3:${await closedPort()}` });
  try {
    const r = await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(r.status, 502);
    assert.equal(r.headers['content-type'], 'application/json');
    assert.deepEqual(r.json(), { error: 'Upstream unreachable.', code: 'upstream_unreachable' });
    const line = gw.logs().find((l) => l.msg === 'request completed');
    assert.equal(line?.level, 40);
    assert.equal(line?.error, 'ECONNREFUSED');
  } finally {
    await gw.close();
  }
});

test('a TLS failure before the response is 502 upstream_unreachable', async () => {
  // An https:// upstream URL pointing at a plain-HTTP server: the TLS handshake fails.
  const up = await startUpstream();
  const gw = await startGateway({ speech: up.url.replace('http:', 'https:') });
  try {
    const r = await request(`${gw.url}/speech/v1/voices`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(r.status, 502);
    assert.deepEqual(r.json(), { error: 'Upstream unreachable.', code: 'upstream_unreachable' });
    const line = gw.logs().find((l) => l.msg === 'request completed');
    assert.match(String(line?.error), /SSL|TLS|EPROTO/i);
    assert.equal(up.requests.length, 0, 'no request was ever readable by the upstream');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a reset before the response is 502; the gateway keeps serving', async () => {
  const up = await startUpstream((req) => req.socket.destroy());
  const gw = await startGateway({ speech: up.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    const r = await request(`${gw.url}/speech/v1/voices`, { headers: auth });
    assert.equal(r.status, 502);
    assert.equal((r.json() as { code: string }).code, 'upstream_unreachable');
    up.handler = (_req, res) => res.end('fine');
    assert.equal((await request(`${gw.url}/speech/v1/voices`, { headers: auth })).body.toString(), 'fine');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('an upstream that does not answer in time is 504 upstream_timeout, and the upstream request is cancelled', async () => {
  const up = await startUpstream((req) => req.resume());
  const gw = await startGateway({ speech: up.url, env: { KEYWARD_UPSTREAM_TIMEOUT: '300ms' } });
  try {
    const started = Date.now();
    const r = await request(`${gw.url}/speech/v1/voices`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(r.status, 504);
    assert.deepEqual(r.json(), { error: 'Upstream did not answer in time.', code: 'upstream_timeout' });
    assert.ok(Date.now() - started >= 290);
    await eventually(() => up.requests[0]?.aborted === true, 2_000, 'upstream request cancelled');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('an upstream 5xx is passed through unchanged and logged at error', async () => {
  const up = await startUpstream((_req, res) => {
    res.writeHead(500, { 'content-type': 'text/plain', 'x-upstream': 'yes' });
    res.end('upstream broke');
  });
  const gw = await startGateway({ seo: up.url });
  try {
    const r = await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(r.status, 500);
    assert.equal(r.body.toString(), 'upstream broke');
    assert.equal(r.headers['x-upstream'], 'yes');
    assert.equal(gw.logs().find((l) => l.msg === 'request completed')?.level, 50);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('bodies over the limit are 413 payload_too_large: declared ones before any upstream contact', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ speech: up.url, env: { KEYWARD_MAX_BODY: '1KiB' } });
  try {
    const auth = `Authorization: Bearer ${gw.token}\r\n`;
    const declared = await raw(gw.port, `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Content-Length: 1025\r\n\r\n`);
    assert.match(declared, /^HTTP\/1\.1 413 /);
    assert.match(declared, /connection: close/i);
    assert.match(declared, /"code":"payload_too_large"/);
    // With Expect: 100-continue the client is refused before it sends a byte of body.
    const expect = await raw(gw.port, `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Content-Length: 5000000\r\nExpect: 100-continue\r\n\r\n`);
    assert.doesNotMatch(expect, /100 Continue/);
    assert.match(expect, /^HTTP\/1\.1 413 /);
    assert.equal(up.connections(), 0);
    // Exactly at the limit passes.
    const atLimit = await raw(gw.port, `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Content-Length: 1024\r\nConnection: close\r\n\r\n${'a'.repeat(1024)}`);
    assert.match(atLimit, /^HTTP\/1\.1 200 /);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a chunked body that grows past the limit is cut off with 413 and the upstream request aborted', async () => {
  const up = await startUpstream((req) => req.resume());
  const gw = await startGateway({ speech: up.url, env: { KEYWARD_MAX_BODY: '1KiB' } });
  try {
    const chunk = `200\r\n${'a'.repeat(512)}\r\n`;
    const out = await raw(
      gw.port,
      `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${gw.token}\r\nTransfer-Encoding: chunked\r\n\r\n${chunk.repeat(4)}0\r\n\r\n`,
    );
    assert.match(out, /^HTTP\/1\.1 413 /);
    assert.match(out, /"code":"payload_too_large"/);
    await eventually(() => up.requests.length === 0 || up.requests[0]?.aborted === true, 2_000, 'upstream request aborted');
    assert.equal(
      up.requests.some((r) => r.ended),
      false,
    );
  } finally {
    await gw.close();
    await up.close();
  }
});

test('an unauthenticated upload with Expect: 100-continue is refused before its body is sent', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ speech: up.url });
  try {
    const out = await raw(gw.port, 'POST /speech/v1/speech-to-text HTTP/1.1\r\nHost: gw\r\nContent-Length: 50000000\r\nExpect: 100-continue\r\n\r\n');
    assert.doesNotMatch(out, /100 Continue/);
    assert.match(out, /^HTTP\/1\.1 401 /);
    assert.match(out, /connection: close/i);
    assert.equal(up.connections(), 0);
  } finally {
    await gw.close();
    await up.close();
  }
});
