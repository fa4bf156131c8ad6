// The request line's template writes exactly what pino writes for the same
// fields, for any field values: a reader of pino's output sees no difference.
import assert from 'node:assert/strict';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import fc from 'fast-check';
import pino from 'pino';
import { requestLogger, type RequestFields, type RequestLevel } from '../../src/observe/log.ts';

function capture(): { stream: Writable; lines: string[] } {
  const lines: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _enc, cb) {
      lines.push(chunk.toString());
      cb();
    },
  });
  return { stream, lines };
}

const text = fc.oneof(fc.string(), fc.string({ unit: 'grapheme' }), fc.string({ unit: 'binary' }));
const maybe = <T>(a: fc.Arbitrary<T>): fc.Arbitrary<T | null> => fc.option(a, { nil: null });
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
  bytesIn: maybe(fc.nat()),
  bytesOut: fc.nat(),
  durationMs: fc.double({ min: 0, max: 1e7, noNaN: true }),
  ttfbMs: maybe(fc.double({ min: 0, max: 1e7, noNaN: true })),
  queuedMs: maybe(fc.double({ min: 0, max: 3e5, noNaN: true })),
  error: maybe(text),
  authFailure: maybe(text),
  credential: maybe(fc.integer({ min: 1, max: 32 })),
  refusedBy: maybe(text),
  aborted: fc.boolean(),
});

test('the template line is byte for byte the line pino writes, for any fields and level', () => {
  const options = { level: 'info', base: { service: 'keyward', pid: 4242 }, timestamp: () => ',"time":1700000000000' };
  const ours = capture();
  const theirs = capture();
  const template = requestLogger(pino(options, ours.stream));
  const reference = pino(options, theirs.stream);
  fc.assert(
    fc.property(fields, fc.constantFrom<RequestLevel>('info', 'warn', 'error'), (f, level) => {
      template(level, f);
      reference[level](f, 'request completed');
      const a = ours.lines.pop();
      const b = theirs.lines.pop();
      assert.equal(a, b);
      assert.deepEqual(JSON.parse(a as string).keyName, f.keyName);
    }),
    { numRuns: 500 },
  );
});

test('the template follows the logger level, also when it changes', () => {
  const out = capture();
  const logger = pino({ level: 'warn' }, out.stream);
  const line = requestLogger(logger);
  const f: RequestFields = {
    reqId: '1',
    traceId: null,
    client: null,
    keyId: null,
    keyName: null,
    route: null,
    method: 'GET',
    path: '/',
    status: 200,
    bytesIn: 0,
    bytesOut: 0,
    durationMs: 1,
    ttfbMs: null,
    queuedMs: null,
    error: null,
    authFailure: null,
    credential: null,
    refusedBy: null,
    aborted: false,
  };
  line('info', f);
  assert.equal(out.lines.length, 0);
  line('warn', f);
  assert.equal(out.lines.length, 1);
  logger.level = 'info';
  line('info', f);
  assert.equal(out.lines.length, 2);
  logger.level = 'silent';
  line('error', f);
  assert.equal(out.lines.length, 2);
});
