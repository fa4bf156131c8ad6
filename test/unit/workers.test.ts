import assert from 'node:assert/strict';
import { PassThrough, Writable } from 'node:stream';
import { test } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { relayLines } from '../../src/process/workers.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';

test('relayLines passes only whole lines, holding a partial tail until its newline', () => {
  const source = new PassThrough();
  const writes: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _e, cb) {
      writes.push(chunk.toString());
      cb();
    },
  });
  relayLines(source, sink);
  source.write('{"a":1}\n{"b":');
  source.write('2}\n{"c"');
  source.write(':3}');
  source.write('\n');
  source.end('{"unterminated":true}');
  return new Promise<void>((resolve) =>
    setImmediate(() => {
      assert.deepEqual(writes, ['{"a":1}\n', '{"b":2}\n', '{"c":3}\n', '{"unterminated":true}\n']);
      for (const w of writes) assert.ok(w.endsWith('\n'));
      resolve();
    }),
  );
});

test('KEYWARD_WORKERS: a whole number or auto, default 1', () => {
  const read = (): string => {
    throw Object.assign(new Error('x'), { code: 'ENOENT' });
  };
  assert.equal(loadConfig({}, read, '/', UPSTREAMS).workers, 1);
  assert.equal(loadConfig({ KEYWARD_WORKERS: '3' }, read, '/', UPSTREAMS).workers, 3);
  assert.ok(loadConfig({ KEYWARD_WORKERS: 'auto' }, read, '/', UPSTREAMS).workers >= 1);
  for (const bad of ['0', '-1', 'two', '1.5', '1000']) {
    assert.throws(() => loadConfig({ KEYWARD_WORKERS: bad }, read, '/', UPSTREAMS), /KEYWARD_WORKERS must be/, bad);
  }
});
