// SIGTERM semantics, exercised through Gateway.shutdown(): stop accepting,
// finish what is in flight up to the drain deadline, then close.
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

function streamingUpstream(chunks: number, everyMs: number) {
  return startUpstream((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'audio/mpeg' });
    let n = 0;
    const t = setInterval(() => {
      res.write(`chunk${n}.`);
      if (++n === chunks) {
        clearInterval(t);
        res.end();
      }
    }, everyMs);
    res.on('close', () => clearInterval(t));
  });
}

test('in-flight streams finish during the drain; new connections are refused; then it stops', async () => {
  const up = await streamingUpstream(8, 100);
  const gw = await startGateway({ speech: up.url });
  try {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const body = deadline(
      new Promise<string>((resolve, reject) => {
        http
          .get(`${gw.url}/speech/v1/stream`, { headers: { authorization: `Bearer ${gw.token}` }, agent }, (res) => {
            let text = '';
            res.setEncoding('latin1');
            res.on('data', (d: string) => (text += d));
            res.on('end', () => resolve(text));
          })
          .on('error', reject);
      }),
      5_000,
      'in-flight stream',
    );
    await eventually(() => up.requests.length === 1, 2_000, 'stream started');
    const stopped = gw.gateway.shutdown();
    await assert.rejects(raw(gw.port, 'GET / HTTP/1.1\r\n\r\n'), /ECONNREFUSED/);
    assert.equal(await body, 'chunk0.chunk1.chunk2.chunk3.chunk4.chunk5.chunk6.chunk7.');
    await deadline(stopped, 2_000, 'shutdown after the last stream');
    agent.destroy();
    assert.ok(gw.logs().some((l) => l.msg === 'stopped'));
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a request arriving on a busy connection while draining gets 503 shutting_down with Connection: close', async () => {
  const up = await streamingUpstream(5, 100);
  const gw = await startGateway({ speech: up.url });
  const socket = net.connect(gw.port, '127.0.0.1');
  try {
    const auth = `Authorization: Bearer ${gw.token}\r\n`;
    let received = '';
    socket.setEncoding('latin1');
    socket.on('data', (d: string) => (received += d));
    const closed = deadline(new Promise((r) => socket.on('close', r)), 5_000, 'connection closed');
    socket.write(`GET /speech/v1/a HTTP/1.1\r\nHost: gw\r\n${auth}\r\n`);
    await eventually(() => received.includes('chunk0.'), 2_000, 'first response streaming');
    const stopped = gw.gateway.shutdown();
    // The connection is busy, so the drain leaves it open; its next request is refused.
    socket.write(`GET /speech/v1/b HTTP/1.1\r\nHost: gw\r\n${auth}\r\n`);
    await closed;
    await deadline(stopped, 3_000, 'drained');
    const [first, second] = received.split(/(?=HTTP\/1\.1 )/);
    assert.match(first ?? '', /^HTTP\/1\.1 200 [\s\S]*chunk4\./);
    assert.match(second ?? '', /^HTTP\/1\.1 503 /);
    assert.match(second ?? '', /connection: close/i);
    assert.match(second ?? '', /\{"error":"The gateway is shutting down.","code":"shutting_down"\}/);
    assert.equal(up.requests.length, 1);
  } finally {
    socket.destroy();
    await gw.close();
    await up.close();
  }
});

test('the drain deadline cuts streams that outlive it', async () => {
  const up = await streamingUpstream(1_000, 100);
  const gw = await startGateway({ speech: up.url, env: { KEYWARD_DRAIN_TIMEOUT: '300ms' } });
  try {
    const cut = deadline(
      new Promise<boolean>((resolve) => {
        http.get(`${gw.url}/speech/v1/stream`, { headers: { authorization: `Bearer ${gw.token}` }, agent: false }, (res) => {
          res.on('data', () => undefined);
          res.on('error', () => undefined);
          res.on('close', () => resolve(res.complete));
        });
      }),
      3_000,
      'stream cut',
    );
    await eventually(() => up.requests.length === 1, 2_000, 'stream started');
    const started = Date.now();
    await deadline(gw.gateway.shutdown(), 2_000, 'shutdown');
    assert.equal(await cut, false);
    const took = Date.now() - started;
    assert.ok(took >= 250 && took < 10_000, `shutdown took ${took} ms`);
    assert.ok(gw.logs().some((l) => l.msg === 'drain deadline reached; closing remaining connections'));
  } finally {
    await gw.close();
    await up.close();
  }
});
