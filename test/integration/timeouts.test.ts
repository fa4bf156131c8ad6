// Timeouts the gateway owns (docs/responses.md, configuration.md): idle in both directions, the
// upstream's answer timer starting after the upload, the headers timeout,
// and no total deadline on anything that keeps moving.
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

/** Send a request with a body written by `write`, collect the reply (or the close). */
function upload(
  port: number,
  token: string,
  length: number,
  write: (req: http.ClientRequest) => Promise<void>,
): Promise<{ status: number | null; body: string; error: string | null }> {
  return deadline(
    new Promise((resolve) => {
      const req = http.request(
        {
          port,
          host: '127.0.0.1',
          method: 'POST',
          path: '/speech/v1/upload',
          agent: false,
          headers: { authorization: `Bearer ${token}`, 'content-length': length },
        },
        (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (d: string) => (body += d));
          res.on('end', () => resolve({ status: res.statusCode ?? null, body, error: null }));
          res.on('error', (e: NodeJS.ErrnoException) => resolve({ status: res.statusCode ?? null, body, error: e.code ?? 'error' }));
        },
      );
      req.on('error', (e: NodeJS.ErrnoException) => resolve({ status: null, body: '', error: e.code ?? 'error' }));
      void write(req);
    }),
    15_000,
    'upload',
  );
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

test('a client body that stalls gets 408 request_timeout and its upstream request is cancelled', async () => {
  const up = await startUpstream((req) => req.resume());
  const gw = await startGateway({ speech: up.url, env: { KEYWARD_IDLE_TIMEOUT: '300ms' } });
  try {
    const started = Date.now();
    const r = await upload(gw.port, gw.token, 100, async (req) => {
      req.write('0123456789');
    });
    assert.equal(r.status, 408);
    assert.deepEqual(JSON.parse(r.body), { error: 'The request body stalled.', code: 'request_timeout' });
    const waited = Date.now() - started;
    assert.ok(waited >= 280 && waited < 10_000, `answered after ${waited} ms`);
    await eventually(() => up.requests[0]?.aborted === true, 2_000, 'upstream request cancelled');
    const line = gw.logs().find((l) => l.msg === 'request completed');
    assert.equal(line?.error, 'request_timeout');
    assert.equal(line?.status, 408);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('an upload slower than the upstream timeout succeeds while it keeps moving: the answer timer starts after the body is sent', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ speech: up.url, env: { KEYWARD_UPSTREAM_TIMEOUT: '300ms', KEYWARD_IDLE_TIMEOUT: '2s' } });
  try {
    const started = Date.now();
    const r = await upload(gw.port, gw.token, 12, async (req) => {
      for (let i = 0; i < 12; i++) {
        req.write('x');
        await sleep(100);
      }
      req.end();
    });
    assert.ok(Date.now() - started >= 1_100, 'the upload took longer than the upstream timeout');
    assert.equal(r.status, 200, r.body);
    assert.equal((JSON.parse(r.body) as { bytes: number }).bytes, 12);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('an upstream that sends headers and then stalls has its client connection closed after the idle time', async () => {
  const up = await startUpstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'audio/mpeg' });
    res.write(Buffer.alloc(1000, 7));
  });
  const gw = await startGateway({ speech: up.url, env: { KEYWARD_IDLE_TIMEOUT: '300ms' } });
  try {
    const started = Date.now();
    const outcome = await deadline(
      new Promise<{ status: number; bytes: number; error: string | null }>((resolve) => {
        http.get(`${gw.url}/speech/v1/stream`, { agent: false, headers: { authorization: `Bearer ${gw.token}` } }, (res) => {
          let bytes = 0;
          res.on('data', (d: Buffer) => (bytes += d.length));
          res.on('error', (e: NodeJS.ErrnoException) => resolve({ status: res.statusCode as number, bytes, error: e.code ?? 'error' }));
          res.on('end', () => resolve({ status: res.statusCode as number, bytes, error: null }));
        });
      }),
      5_000,
      'stalled stream closed',
    );
    const waited = Date.now() - started;
    assert.equal(outcome.status, 200);
    assert.equal(outcome.bytes, 1000);
    assert.notEqual(outcome.error, null, 'the client sees a cut connection, not a clean end');
    assert.ok(waited >= 280 && waited < 10_000, `closed after ${waited} ms`);
    await eventually(() => up.requests[0]?.aborted === true, 2_000, 'upstream request cancelled');
    await eventually(() => gw.logs().some((l) => l.msg === 'request completed'), 2_000, 'completion line');
    const line = gw.logs().find((l) => l.msg === 'request completed');
    assert.equal(line?.error, 'upstream_idle');
    assert.equal(line?.client, '127.0.0.1');
    assert.equal(line?.level, 40);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('no total deadline cuts a stream that keeps moving', async () => {
  const up = await startUpstream((_req, res) => {
    res.writeHead(200, { 'content-type': 'audio/mpeg' });
    let n = 0;
    const t = setInterval(() => {
      res.write(Buffer.alloc(100, n));
      if (++n === 12) {
        clearInterval(t);
        res.end();
      }
    }, 100);
  });
  const gw = await startGateway({ speech: up.url, env: { KEYWARD_IDLE_TIMEOUT: '300ms', KEYWARD_UPSTREAM_TIMEOUT: '300ms' } });
  try {
    const r = await request(`${gw.url}/speech/v1/stream`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(r.status, 200);
    assert.equal(r.body.length, 1200);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a client trickling its headers is dropped within about the headers timeout while others are served', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, env: { KEYWARD_HEADERS_TIMEOUT: '500ms' } });
  try {
    const started = Date.now();
    const loris = net.connect(gw.port, '127.0.0.1');
    let received = '';
    loris.setEncoding('latin1').on('data', (d: string) => (received += d));
    loris.on('error', () => undefined);
    const closed = new Promise<void>((r) => loris.on('close', () => r()));
    const head = `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\nx-slow: ${'a'.repeat(100)}`;
    let i = 0;
    const trickle = setInterval(() => {
      if (i < head.length && !loris.destroyed) loris.write(head[i++] as string);
    }, 50);
    try {
      // Others are served normally meanwhile.
      for (let k = 0; k < 5; k++) {
        const r = await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } });
        assert.equal(r.status, 200);
      }
      await deadline(closed, 3_000, 'slow client dropped');
    } finally {
      clearInterval(trickle);
    }
    const waited = Date.now() - started;
    assert.ok(waited >= 450 && waited < 10_000, `dropped after ${waited} ms`);
    assert.match(received, /^HTTP\/1\.1 408 /);
    assert.match(received, /"code":"request_timeout"/);
  } finally {
    await gw.close();
    await up.close();
  }
});
