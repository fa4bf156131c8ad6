// Request-framing regressions over raw sockets. What matters is what the
// upstream's parser sees: exactly the requests the client framed, never a
// second one hidden in a body.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw, statusLines } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { startUpstream, type MockUpstream } from '../support/upstream.ts';

async function withSpeech(fn: (gw: TestGateway, up: MockUpstream) => Promise<void>): Promise<void> {
  const up = await startUpstream();
  const gw = await startGateway({ speech: up.url, seo: up.url });
  try {
    await fn(gw, up);
  } finally {
    await gw.close();
    await up.close();
  }
}

const SMUGGLED = 'GET /v1/smuggled HTTP/1.1\r\nHost: upstream\r\n\r\n';

test('GHSA-ggv3-7p47-pfv8: a chunked DELETE keeps its framing; its body is never a second request', async () => {
  await withSpeech(async (gw, up) => {
    const chunk = `${SMUGGLED.length.toString(16)}\r\n${SMUGGLED}\r\n0\r\n\r\n`;
    const one = `DELETE /speech/v1/history/a HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${gw.token}\r\nTransfer-Encoding: chunked\r\n\r\n${chunk}`;
    // Twice on one connection, so a keep-alive upstream socket is reused.
    const out = await raw(gw.port, one + one.replace('HTTP/1.1\r\n', 'HTTP/1.1\r\nConnection: close\r\n'));
    assert.equal(statusLines(out).length, 2);
    assert.deepEqual(
      up.requests.map((r) => `${r.method} ${r.url}`),
      ['DELETE /v1/history/a', 'DELETE /v1/history/a'],
    );
    for (const r of up.requests) assert.equal(r.body.toString('latin1'), SMUGGLED);
    assert.equal(
      up.requests.some((r) => r.url.includes('smuggled')),
      false,
    );
  });
});

test('a body-carrying DELETE with Content-Length named in Connection stays framed', async () => {
  await withSpeech(async (gw, up) => {
    const one = `DELETE /speech/v1/history/a HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${gw.token}\r\nConnection: Content-Length\r\nContent-Length: ${SMUGGLED.length}\r\n\r\n${SMUGGLED}`;
    const out = await raw(gw.port, one + one.replace('Connection: Content-Length', 'Connection: close, Content-Length'));
    assert.equal(statusLines(out).length, 2);
    assert.deepEqual(
      up.requests.map((r) => r.url),
      ['/v1/history/a', '/v1/history/a'],
    );
    for (const r of up.requests) assert.equal(r.body.toString('latin1'), SMUGGLED);
  });
});

test('ambiguous framing is refused with 400 JSON and never forwarded', async () => {
  await withSpeech(async (gw, up) => {
    const auth = `Authorization: Bearer ${gw.token}\r\n`;
    const cases = [
      // CL.TE and TE.CL
      `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n${SMUGGLED}`,
      `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Transfer-Encoding: chunked\r\nContent-Length: 40\r\n\r\n0\r\n\r\n${SMUGGLED}`,
      // two different lengths
      `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Content-Length: 1\r\nContent-Length: 2\r\n\r\nab`,
      // a transfer coding other than chunked last, and one that merely contains it
      `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n`,
      `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n`,
      // obsolete line folding and whitespace before the colon
      `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n`,
      `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\n${auth}Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n`,
      // bare LF line ends
      `POST /speech/v1/x HTTP/1.1\nHost: gw\n${auth.trim()}\nContent-Length: 0\n\n`,
    ];
    for (const bytes of cases) {
      const out = await raw(gw.port, bytes);
      assert.match(out, /^HTTP\/1\.1 400 /, JSON.stringify(bytes));
      assert.match(out, /\{"error":"Malformed request.","code":"bad_request"\}/, JSON.stringify(bytes));
    }
    // The gateway is still serving afterwards.
    const ok = await raw(gw.port, `GET /speech/v1/voices HTTP/1.1\r\nHost: gw\r\n${auth}Connection: close\r\n\r\n`);
    assert.match(ok, /^HTTP\/1\.1 200 /);
    assert.deepEqual(
      up.requests.map((r) => r.url),
      ['/v1/voices'],
    );
  });
});

test('a body that turns malformed mid-stream is answered 400 and closed; the upstream request never completes', async () => {
  await withSpeech(async (gw, up) => {
    up.handler = (req) => req.resume(); // never answers: only the framing matters here
    const out = await raw(
      gw.port,
      `POST /speech/v1/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${gw.token}\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n${SMUGGLED}\r\n0\r\n\r\n`,
    );
    // No response had begun, so the client learns why; the connection is closed either way.
    assert.match(out, /^HTTP\/1\.1 400 [\s\S]*connection: close[\s\S]*\{"error":"Malformed request.","code":"bad_request"\}$/);
    await eventually(() => gw.logs().some((l) => l.msg === 'request completed'), 3_000, 'the exchange was logged');
    // Either the upstream never saw the request, or it saw it torn down: it never completed.
    await eventually(() => up.requests.every((r) => r.aborted), 3_000, 'upstream request torn down');
    assert.equal(
      up.requests.some((r) => r.ended),
      false,
    );
    assert.equal(
      up.requests.some((r) => r.url.includes('smuggled')),
      false,
    );
    assert.equal(gw.logs().find((l) => l.msg === 'request completed')?.status, 400);
  });
});

test('pipelined requests on one connection are answered in order, each rewritten', async () => {
  await withSpeech(async (gw, up) => {
    const auth = `Authorization: Bearer ${gw.token}\r\n`;
    const out = await raw(
      gw.port,
      `GET /seo/v3/first HTTP/1.1\r\nHost: gw\r\n${auth}\r\n` +
        `POST /speech/v1/second HTTP/1.1\r\nHost: gw\r\n${auth}Content-Length: 3\r\n\r\nabc` +
        `GET /seo/v3/third HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer kw_unknown\r\n\r\n` +
        `GET /seo/v3/fourth HTTP/1.1\r\nHost: gw\r\n${auth}Connection: close\r\n\r\n`,
    );
    assert.deepEqual(
      statusLines(out).map((l) => l.slice(9, 12)),
      ['200', '200', '401', '200'],
    );
    const bodies = out.match(/"url":"[^"]+"/g);
    assert.deepEqual(bodies, ['"url":"/v3/first"', '"url":"/v1/second"', '"url":"/v3/fourth"']);
    assert.equal(up.raw().toString('latin1').includes(gw.token), false);
  });
});
