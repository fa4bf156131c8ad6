// The completion point (docs/logs.md): one line per request with the
// outcome recorded once, the egress warning, and the metrics from the same
// fields.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { createCompletion } from '../../src/request/completion.ts';
import { secretForms } from '../../src/request/egress.ts';
import { loadConfig } from '../../src/config/load.ts';
import { Exchange, type GatewayRequest } from '../../src/request/exchange.ts';
import { createLogger } from '../../src/observe/log.ts';
import { Metrics } from '../../src/observe/metrics.ts';
import { failureLabel, upstream } from '../../src/request/outcome.ts';
import { type Route, UPSTREAMS } from '../../src/request/routes.ts';
import { parseProm } from '../support/prom.ts';

function setup(): { lines: () => Array<Record<string, unknown>>; complete: ReturnType<typeof createCompletion>; metrics: Metrics } {
  let text = '';
  const sink = new Writable({
    write(chunk: Buffer, _e, cb) {
      text += chunk.toString();
      cb();
    },
  });
  const metrics = new Metrics({ defaults: false, routes: UPSTREAMS.map((u) => u.name) });
  const complete = createCompletion(createLogger('info', sink).logger, metrics, () => new Set(['token']));
  return {
    lines: () =>
      text
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as Record<string, unknown>),
    complete,
    metrics,
  };
}

function exchange(url: string, method = 'GET'): Exchange {
  const req = { socket: { remoteAddress: '127.0.0.1' }, method, headers: {}, complete: true } as unknown as GatewayRequest;
  return new Exchange('r1', req, url);
}

const config = loadConfig({ KEYWARD_SPEECH_KEY: 'speech-secret-value' }, () => '', '/', UPSTREAMS);
const speech = config.routes.find((r) => r.name === 'speech') as Route;

test('the first recorded cause is the one logged: a later consequence never overwrites it', () => {
  const ex = exchange('/speech/v1/x');
  ex.fail(upstream('timeout', 'KEYWARD_UPSTREAM_TIMEOUT'));
  ex.fail(upstream('unreachable', 'ECONNRESET'));
  ex.takeOver({ by: 'gateway', code: 'upstream_timeout' });
  assert.equal(failureLabel(ex.failure), 'KEYWARD_UPSTREAM_TIMEOUT');
  assert.equal(ex.upstreamFailed, true);
  assert.equal(ex.takenOver, true);
});

test('labels: catalogue codes, system codes, and named reasons', () => {
  assert.equal(failureLabel(null), null);
  assert.equal(failureLabel({ by: 'gateway', code: 'unauthorized' }), 'unauthorized');
  assert.equal(failureLabel(upstream('unreachable', 'ECONNREFUSED')), 'ECONNREFUSED');
  assert.equal(failureLabel(upstream('aborted')), 'upstream_aborted');
  assert.equal(failureLabel(upstream('invalid_response')), 'invalid_upstream_response');
  assert.equal(failureLabel({ by: 'client', reason: 'idle' }), 'client_idle');
});

test('one line per request; an upstream failure is a warn line and an upstream-error metric; a masked secret adds its warning', async () => {
  const { lines, complete, metrics } = setup();
  const failed = exchange('/speech/v1/a?token=abc');
  failed.route = speech;
  failed.fail(upstream('unreachable', 'ECONNREFUSED'));
  complete(failed, 502, false);
  const masked = exchange('/speech/v1/user');
  masked.route = speech;
  masked.masked = secretForms(config.routes).forms.filter((f) => f.route === 'speech' && f.form === 'key');
  complete(masked, 200, false);
  const noRoute = exchange('/nowhere?token=abc');
  noRoute.takeOver({ by: 'gateway', code: 'not_found' });
  complete(noRoute, 404, false);
  const done = lines().filter((l) => l.msg === 'request completed');
  assert.deepEqual(
    done.map((l) => [l.level, l.status, l.error, l.route]),
    [
      [40, 502, 'ECONNREFUSED', 'speech'],
      [30, 200, null, 'speech'],
      [30, 404, 'not_found', null],
    ],
  );
  assert.equal(done[2]?.path, '/nowhere', 'credential parameters scrubbed from an unrouted path');
  const warned = lines().filter((l) => l.msg === 'upstream secret found in a response and kept from the client');
  assert.deepEqual(
    warned.map((l) => [l.route, l.path, l.secrets]),
    [['speech', '/speech/v1/user', ['speech key']]],
  );
  const m = parseProm(await metrics.text());
  assert.equal(m.sum('keyward_upstream_errors_total', { route: 'speech', reason: 'ECONNREFUSED' }), 1);
  assert.equal(m.sum('keyward_egress_masked_total', { route: 'speech', secret: 'speech key' }), 1);
  assert.equal(m.sum('keyward_requests_total'), 3);
});
