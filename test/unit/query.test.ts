import assert from 'node:assert/strict';
import { test } from 'node:test';
import { dropParams, hasParam } from '../../src/request/query.ts';

const token = new Set(['token']);
const xi = new Set(['xi-api-key']);

test('dropParams removes every spelling of a credential parameter and keeps the rest byte for byte', () => {
  const cases: Array<[string, ReadonlySet<string>, string]> = [
    ['token=a', token, ''],
    ['token=a&x=1', token, 'x=1'],
    ['x=1&token=a', token, 'x=1'],
    ['x=1&token=a&y=2', token, 'x=1&y=2'],
    ['token&x=1', token, 'x=1'],
    ['token=&x=1', token, 'x=1'],
    ['x=1&token=a&token=b&token', token, 'x=1'],
    ['tok%65n=a&x=1', token, 'x=1'],
    ['%74%6F%6B%65%6E=a&x=1', token, 'x=1'],
    ['TOKEN=a&Token=b&x=1', token, 'x=1'],
    ['token[]=a&token[x]=b&x=1', token, 'x=1'],
    ['xi-api-key=a&xi%2Dapi%2Dkey=b&XI-API-KEY=c&v=1', xi, 'v=1'],
    // the rest is never decoded, re-encoded or reordered
    ['b=2&a=1&q=a%20b+c&e=%zz&&=&z', token, 'b=2&a=1&q=a%20b+c&e=%zz&&=&z'],
    ['b=2&token=x&&a=%2F', token, 'b=2&&a=%2F'],
    ['tokens=1&mytoken=2&token_id=3', token, 'tokens=1&mytoken=2&token_id=3'],
    ['x=token&y=tok%65n', token, 'x=token&y=tok%65n'],
  ];
  for (const [input, names, expected] of cases) assert.equal(dropParams(input, names), expected, input);
});

test('dropParams returns the very same string when nothing matches', () => {
  const q = 'a=1&b=2';
  assert.equal(dropParams(q, token), q);
  assert.equal(dropParams(q, new Set()), q);
  assert.equal(dropParams('', token), '');
});

test('hasParam finds override parameters in any spelling', () => {
  const method = new Set(['method']);
  assert.equal(hasParam('method=DELETE', method), true);
  assert.equal(hasParam('a=1&METH%4FD=DELETE', method), true);
  assert.equal(hasParam('a=1&method', method), true);
  assert.equal(hasParam('a=1&methods=2&x=method', method), false);
  assert.equal(hasParam('', method), false);
  assert.equal(hasParam('method=1', new Set()), false);
});
