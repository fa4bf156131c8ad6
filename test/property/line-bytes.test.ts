// The request line written as bytes into the log's batch buffer is byte for
// byte the line's template string (which is pino's line: log-line.test.ts),
// for any fields, and never runs past the room it asked for.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { test } from 'node:test';
import fc from 'fast-check';
import { lineBound, writeLine, type RequestFields } from '../../src/observe/line-bytes.ts';
import { templateLine } from '../../src/observe/log.ts';

const text = fc.oneof(
  fc.string(),
  fc.string({ unit: 'grapheme' }),
  fc.string({ unit: 'binary' }),
  fc.string({ unit: fc.constantFrom('a', '"', '\\', '\n', '\u007f', 'é', '\ud800') }),
);
const maybe = <T>(a: fc.Arbitrary<T>): fc.Arbitrary<T | null> => fc.option(a, { nil: null });
/** Durations as the gateway gives them (rounded to thousandths), and any other double. */
const ms = fc.oneof(
  fc.nat({ max: 1e9 }).map((k) => k / 1000),
  fc.double({ min: 0, max: 1e7, noNaN: true }),
  fc.constantFrom(0, -0, 0.001, 0.01, 0.1, 1.005, 999999.999, 1e9, 1e21, 5e-7, -1.5),
);
const count = fc.oneof(fc.nat(), fc.maxSafeNat(), fc.constantFrom(0, 9, 10, 99, 100, 1e15, 2 ** 53, -3));
const fields: fc.Arbitrary<RequestFields> = fc.record({
  reqId: text,
  traceId: maybe(text),
  client: maybe(text),
  keyId: maybe(text),
  keyName: maybe(text),
  route: maybe(text),
  method: text,
  path: text,
  status: maybe(fc.integer({ min: 100, max: 599 })),
  bytesIn: maybe(count),
  bytesOut: count,
  durationMs: ms,
  ttfbMs: maybe(ms),
  queuedMs: maybe(ms),
  error: maybe(text),
  authFailure: maybe(text),
  credential: maybe(fc.integer({ min: 1, max: 32 })),
  refusedBy: maybe(text),
  aborted: fc.boolean(),
});
const bindings = fc.constantFrom(',"service":"keyward","pid":4242', '', ',"service":"kéyward","pid":1');
const time = fc.constantFrom(',"time":1700000000000', ',"time":"2026-11-26T19:00:00.000Z"', '', ',"time":"é"');

test('the line written as bytes is the template line, for any fields, level, time and bindings', () => {
  const buf = Buffer.alloc(1 << 20, 0xee);
  fc.assert(
    fc.property(fields, fc.constantFrom(30, 40, 50), time, bindings, fc.nat({ max: 64 }), (f, level, t, b, at) => {
      const bound = lineBound(t, b, f);
      const end = writeLine(buf, at, level, t, b, f);
      const expected = templateLine(level, t, b, f);
      assert.equal(buf.subarray(at, end).toString('utf8'), expected);
      assert.ok(end - at <= bound, `${end - at} bytes written, ${bound} asked for`);
      buf.fill(0xee, at, end);
    }),
    { numRuns: 2000 },
  );
});

test('with no time piece the line carries the epoch time in ms, written as digits', () => {
  const buf = Buffer.alloc(4096);
  const f: RequestFields = {
    reqId: 'r1',
    traceId: '4bf92f3577b34da6a3ce929d0e0e4736',
    client: '127.0.0.1',
    keyId: 'k',
    keyName: null,
    route: 'seo',
    method: 'GET',
    path: '/seo/x?y=1',
    status: 200,
    bytesIn: 0,
    bytesOut: 12,
    durationMs: 1.25,
    ttfbMs: 0.5,
    queuedMs: null,
    error: null,
    authFailure: null,
    credential: null,
    refusedBy: null,
    aborted: false,
  };
  const before = Date.now();
  const end = writeLine(buf, 0, 30, null, ',"pid":7', f);
  const after = Date.now();
  const line = buf.subarray(0, end).toString();
  const time = Number(/"time":(\d+),/.exec(line)?.[1]);
  assert.ok(time >= before && time <= after, line);
  assert.equal(line, templateLine(30, `,"time":${time}`, ',"pid":7', f));
});

test('a line too long for the batch buffer is written whole, as a string, after the lines before it', () => {
  // The default destination writes to stdout: a child process, whose output is read here.
  const script = `
    import { createLogger, requestLogger } from ${JSON.stringify(new URL('../../src/observe/log.ts', import.meta.url).href)};
    const log = createLogger('info');
    const line = requestLogger(log.logger);
    const f = { reqId: 'a', traceId: null, client: null, keyId: null, keyName: null, route: null, method: 'GET', path: '/', status: 200, bytesIn: 0, bytesOut: 0, durationMs: 1, ttfbMs: null, queuedMs: null, error: null, authFailure: null, credential: null, refusedBy: null, aborted: false };
    line('info', f);
    line('warn', { ...f, reqId: 'b', keyName: 'x'.repeat(20000) });
    line('error', { ...f, reqId: 'c', path: '/\\u00e9' });
    await log.flush();
  `;
  const r = spawnSync(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { encoding: 'utf8', timeout: 20_000 });
  assert.equal(r.status, 0, r.stderr);
  const lines = r.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as Record<string, unknown>);
  assert.deepEqual(
    lines.map((l) => [l.reqId, l.level, typeof l.keyName === 'string' ? l.keyName.length : l.keyName, l.path]),
    [
      ['a', 30, null, '/'],
      ['b', 40, 20000, '/'],
      ['c', 50, null, '/é'],
    ],
  );
  assert.ok(lines.every((l) => typeof l.time === 'number' && l.service === 'keyward' && l.msg === 'request completed'));
});
