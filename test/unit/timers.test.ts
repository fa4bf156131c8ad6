// The timeout sweep's decision, `due` (docs/responses.md): which expiry an
// exchange has reached at a given time, from its activity alone.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { IncomingMessage } from 'node:http';
import { Socket } from 'node:net';
import { Exchange, exchangeOf, GatewayRequest } from '../../src/request/exchange.ts';
import { due } from '../../src/request/timers.ts';

const limits = { idleTimeoutMs: 1_000, upstreamTimeoutMs: 5_000 };

/** An exchange over sockets whose byte counters the test moves by hand. */
function exchange(): { ex: Exchange; client: { bytesRead: number; bytesWritten: number }; upstream: { bytesRead: number; bytesWritten: number } } {
  const client = { bytesRead: 0, bytesWritten: 0, remoteAddress: '127.0.0.1' };
  const upstream = { bytesRead: 0, bytesWritten: 0 };
  const req = { socket: client, complete: false } as unknown as GatewayRequest;
  const ex = new Exchange('id', req, '/seo/x');
  return { ex, client, upstream };
}

test('a request whose body stalls is request-idle; one whose upstream stops taking it is upload-stalled', () => {
  const { ex, client } = exchange();
  assert.equal(due(ex, 1_000, limits), null); // first sight: activity marked
  client.bytesRead += 10;
  assert.equal(due(ex, 1_900, limits), null); // moved: the idle clock restarts
  assert.equal(due(ex, 2_899, limits), null);
  assert.equal(due(ex, 2_900, limits), 'request-idle');
  (ex.req as unknown as { complete: boolean }).complete = true;
  assert.equal(due(ex, 2_900, limits), 'upload-stalled');
});

test('the answer timer runs from the moment the request is fully sent, not before', () => {
  const { ex, upstream } = exchange();
  const proxyReq = { socket: upstream, writableFinished: false, writableNeedDrain: false };
  ex.proxyReq = proxyReq as unknown as Exchange['proxyReq'];
  assert.equal(due(ex, 0, limits), null);
  upstream.bytesWritten += 100; // uploading: not the answer timer's business
  assert.equal(due(ex, 900, limits), null);
  proxyReq.writableFinished = true;
  assert.equal(due(ex, 10_000, limits), null, 'the timer starts now');
  assert.equal(due(ex, 14_999, limits), null);
  assert.equal(due(ex, 15_000, limits), 'answer');
});

test('once the response began, only idleness in both directions counts', () => {
  const { ex, client } = exchange();
  ex.ttfbMs = 3;
  assert.equal(due(ex, 0, limits), null);
  client.bytesWritten += 1;
  assert.equal(due(ex, 999, limits), null);
  assert.equal(due(ex, 1_998, limits), null);
  assert.equal(due(ex, 1_999, limits), 'response-idle');
});

test('a listener that reads an exchange never taken in, or the response of an upgrade, fails loudly instead of reading null', () => {
  const socket = new Socket();
  const plain = new IncomingMessage(socket);
  assert.throws(() => exchangeOf(plain), /before the pipeline took the request in/);
  const taken = new GatewayRequest(socket);
  assert.throws(() => exchangeOf(taken), /before the pipeline took the request in/);
  const ex = new Exchange('id', taken, '/seo/x');
  taken.exchange = ex;
  assert.equal(exchangeOf(taken), ex);
  assert.throws(() => ex.webRes, /without a response/);
  socket.destroy();
});
