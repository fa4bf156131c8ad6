// docs/responses.md: responses stream as they arrive, backpressure is respected both
// ways, and a failure on either side is passed on at once.
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import http from 'node:http';
import net from 'node:net';
import { test } from 'node:test';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

const MiB = 1024 * 1024;

test('the first chunk reaches the client before the upstream has finished', async () => {
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  const up = await startUpstream((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'audio/mpeg' });
    res.write('first-chunk');
    void released.then(() => res.end('last-chunk'));
  });
  const gw = await startGateway({ speech: up.url });
  try {
    const body = await deadline(
      new Promise<string>((resolve, reject) => {
        const req = http.request(
          `${gw.url}/speech/v1/text-to-speech/v/stream`,
          { method: 'POST', headers: { authorization: `Bearer ${gw.token}` }, agent: false },
          (res) => {
            let text = '';
            res.setEncoding('latin1');
            res.on('data', (d: string) => {
              text += d;
              if (text === 'first-chunk') release(); // only now may the upstream finish
            });
            res.on('end', () => resolve(text));
          },
        );
        req.on('error', reject);
        req.end('{"text":"hi"}');
      }),
      5_000,
      'streamed response',
    );
    assert.equal(body, 'first-chunklast-chunk');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a paused client makes the gateway stop pulling: 256 MiB stays upstream (memory over time: the soak)', async () => {
  const total = 256 * MiB;
  const block = randomBytes(MiB);
  let sent = 0;
  const up = await startUpstream(
    (req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-length': total });
      const pump = (): void => {
        while (sent < total) {
          sent += block.length;
          if (!res.write(block)) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
    },
    { recordBodies: false },
  );
  const gw = await startGateway({ speech: up.url });
  const socket = net.connect(gw.port, '127.0.0.1');
  try {
    socket.write(`GET /speech/v1/history/x/audio HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${gw.token}\r\nConnection: close\r\n\r\n`);
    socket.pause();
    await eventually(() => sent > 0, 5_000, 'upstream started sending');
    await new Promise((r) => setTimeout(r, 1_500));
    const sentWhilePaused = sent;
    // Socket buffers on three hops hold a few MiB; without backpressure all 256 MiB would be in memory by now.
    assert.ok(sentWhilePaused < 48 * MiB, `upstream sent ${sentWhilePaused / MiB} MiB to a paused client`);

    let received = 0;
    await deadline(
      new Promise<void>((resolve, reject) => {
        socket.on('data', (d: Buffer) => (received += d.length));
        socket.on('end', resolve);
        socket.on('error', reject);
        socket.resume();
      }),
      60_000,
      'the rest of the body',
    );
    assert.ok(received > total && received < total + 1024, `client received ${received} bytes`);
  } finally {
    socket.destroy();
    await gw.close();
    await up.close();
  }
});

test('a 1 GiB upload passes through with a matching SHA-256', async () => {
  const size = 1024 * MiB;
  const up = await startUpstream(
    (req, res) => {
      const hash = createHash('sha256');
      req.on('data', (c: Buffer) => hash.update(c));
      req.on('end', () => res.end(hash.digest('hex')));
    },
    { recordBodies: false },
  );
  const gw = await startGateway({ speech: up.url });
  try {
    const block = randomBytes(MiB);
    const sentHash = createHash('sha256');
    const receivedHash = await deadline(
      new Promise<string>((resolve, reject) => {
        const req = http.request(
          `${gw.url}/speech/v1/speech-to-text`,
          { method: 'POST', headers: { authorization: `Bearer ${gw.token}`, 'content-length': size, 'content-type': 'audio/wav' }, agent: false },
          (res) => {
            let text = '';
            res.setEncoding('utf8');
            res.on('data', (d: string) => (text += d));
            res.on('end', () => resolve(text));
          },
        );
        req.on('error', reject);
        let i = 0;
        const pump = (): void => {
          while (i < 1024) {
            block.writeUInt32BE(i++, 0); // no two blocks alike
            sentHash.update(block);
            if (i === 1024) return void req.end(block);
            if (!req.write(block)) return void req.once('drain', pump);
          }
        };
        pump();
      }),
      120_000,
      '1 GiB upload',
    );
    assert.equal(receivedHash, sentHash.digest('hex'));
    assert.equal(gw.logs().find((l) => l.msg === 'request completed')?.bytesIn, size);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('an upstream that dies mid-body closes the client connection at once', async () => {
  let diedAt = 0;
  const up = await startUpstream((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-length': 100_000 });
    res.write(Buffer.alloc(10_000));
    setTimeout(() => {
      diedAt = Date.now();
      req.socket.destroy();
    }, 50);
  });
  const gw = await startGateway({ speech: up.url });
  try {
    const outcome = await deadline(
      new Promise<{ received: number; complete: boolean }>((resolve, reject) => {
        const req = http.get(`${gw.url}/speech/v1/history/x/audio`, { headers: { authorization: `Bearer ${gw.token}` }, agent: false }, (res) => {
          let received = 0;
          res.on('data', (d: Buffer) => (received += d.length));
          res.on('error', () => undefined);
          res.on('close', () => resolve({ received, complete: res.complete }));
        });
        req.on('error', reject);
      }),
      3_000,
      'client connection closed',
    );
    const lag = Date.now() - diedAt;
    assert.equal(outcome.complete, false);
    assert.equal(outcome.received, 10_000);
    assert.ok(lag < 5_000, `client learned ${lag} ms after the upstream died`);
    await eventually(() => gw.logs().some((l) => l.error === 'upstream_aborted' && l.level === 40), 1_000, 'logged as upstream failure');
  } finally {
    await gw.close();
    await up.close();
  }
});

for (const when of ['before the response', 'mid-response', 'mid-upload'] as const) {
  test(`a client that leaves ${when} cancels its upstream request within 100 ms`, async () => {
    const up = await startUpstream(
      (req, res) => {
        req.resume();
        if (when === 'mid-response') {
          res.writeHead(200);
          res.write('partial');
        }
      },
      { recordBodies: false },
    );
    const gw = await startGateway({ speech: up.url });
    try {
      const client = net.connect(gw.port, '127.0.0.1');
      const head = `POST /speech/v1/text-to-speech/v HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${gw.token}\r\n`;
      if (when === 'mid-upload') client.write(`${head}Content-Length: 10000000\r\n\r\n${'a'.repeat(100_000)}`);
      else client.write(`${head}Content-Length: 2\r\n\r\n{}`);
      await eventually(() => up.requests.length === 1, 3_000, 'request reached the upstream');
      if (when === 'mid-response') {
        await deadline(new Promise((r) => client.once('data', r)), 3_000, 'first bytes');
      }
      const leftAt = performance.now();
      client.destroy();
      // These upstreams bill per request: the cancellation must be prompt (it takes a few ms; 500 leaves room for a busy machine).
      await eventually(() => up.requests[0]?.aborted === true, 1_000, 'upstream request cancelled');
      const lag = performance.now() - leftAt;
      assert.ok(lag < 5_000, `upstream request cancelled ${lag.toFixed(1)} ms after the client left`);
      await eventually(() => gw.logs().some((l) => l.msg === 'request completed' && l.aborted === true), 1_000, 'logged as aborted');
    } finally {
      await gw.close();
      await up.close();
    }
  });
}
