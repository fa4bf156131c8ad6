// The keys file's JSON fault locator agrees with JSON.parse on what is JSON,
// for any value and any damage (docs/keys.md: a damaged file names where).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { jsonErrorOffset, jsonErrorWhere } from '../../src/keys/json-position.ts';

const parses = (s: string): boolean => {
  try {
    JSON.parse(s);
    return true;
  } catch {
    return false;
  }
};

test('any JSON text is found whole; any cut or changed one is refused exactly when JSON.parse refuses it', () => {
  fc.assert(
    fc.property(fc.jsonValue(), fc.nat(), fc.string({ maxLength: 3 }), (v, cut, junk) => {
      const text = JSON.stringify(v, null, cut % 3);
      assert.equal(jsonErrorOffset(text), null);
      const at = cut % (text.length + 1);
      const damaged = text.slice(0, at) + junk + text.slice(at + (cut % 2));
      assert.equal(jsonErrorOffset(damaged) === null, parses(damaged), JSON.stringify(damaged));
      const offset = jsonErrorOffset(damaged);
      if (offset !== null) assert.ok(offset >= 0 && offset <= damaged.length);
    }),
    { numRuns: 3000 },
  );
});

test('the position names the line and column of the fault', () => {
  assert.equal(jsonErrorWhere('{"version":1,"keys":[\n{"id": }\n]}'), ' at line 2, column 8');
  assert.equal(jsonErrorWhere('{"a":1}'), '');
  assert.equal(jsonErrorWhere('{"a":1'), ' at line 1, column 7');
  assert.equal(jsonErrorWhere('{"a":1} x'), ' at line 1, column 9');
});
