import assert from 'node:assert/strict';
import { test } from 'node:test';
import { notice, noticeVersion } from '../../src/keys/pg-schema.ts';

test('a change notice names the version and the ids, or only their number when they would not fit', () => {
  assert.deepEqual(JSON.parse(notice('42', ['key_a', 'key_b'])), { version: '42', ids: ['key_a', 'key_b'] });
  const many = Array.from({ length: 1000 }, (_, i) => `key_${String(i).padStart(12, '0')}`);
  const big = notice('43', many);
  assert.ok(big.length < 8000, "under PostgreSQL's payload limit");
  assert.deepEqual(JSON.parse(big), { version: '43', count: 1000 });
});

test('the version read back from a notice; anything else means "fetch"', () => {
  assert.equal(noticeVersion(notice('9007199254740993', ['x'])), 9007199254740993n);
  assert.equal(noticeVersion('3'), null); // a bare count (older writers)
  assert.equal(noticeVersion('{"version":"1e3"}'), null);
  assert.equal(noticeVersion('{"version":7}'), null);
  assert.equal(noticeVersion('not json'), null);
});
