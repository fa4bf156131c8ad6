// The reader of a top-level cost field (request/cost.ts, TopLevelField) keeps
// its state across chunks: whatever the body and wherever it is cut, it
// reads what JSON.parse reads at the top level, and nothing nested.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { TopLevelField } from '../../src/request/cost.ts';

/** Feed `body` cut at `cuts` (offsets, any order) and end it. */
function read(body: Buffer, cuts: readonly number[]): TopLevelField {
  const f = new TopLevelField('cost');
  let at = 0;
  for (const cut of [...new Set(cuts.map((c) => c % (body.length + 1)))].sort((a, b) => a - b)) {
    f.push(body.subarray(at, cut));
    at = cut;
  }
  f.push(body.subarray(at));
  f.end();
  return f;
}

const leaf = fc.oneof(fc.string(), fc.integer(), fc.double({ noNaN: true, noDefaultInfinity: true }), fc.boolean(), fc.constant(null));
// Nested values may hold a "cost" of their own, and keys with quotes, backslashes and brackets in them.
const nested = fc.letrec((tie) => ({
  value: fc.oneof(
    { depthSize: 'small' },
    leaf,
    fc.array(tie('value'), { maxLength: 3 }),
    fc.dictionary(fc.oneof(fc.string(), fc.constant('cost')), tie('value'), { maxKeys: 3 }),
  ),
})).value;

test('a top-level cost is read whatever the chunks, and a nested one never', () => {
  fc.assert(
    fc.property(
      fc.dictionary(
        fc.string().filter((k) => k !== 'cost'),
        nested,
        { maxKeys: 5 },
      ),
      fc.option(fc.double({ min: 0, max: 1e6, noNaN: true }), { nil: undefined }),
      fc.nat(5),
      fc.array(fc.nat(), { maxLength: 12 }),
      (others, cost, place, cuts) => {
        const entries = Object.entries(others);
        if (cost !== undefined) entries.splice(place % (entries.length + 1), 0, ['cost', cost]);
        const body = Buffer.from(JSON.stringify(Object.fromEntries(entries)));
        const f = read(body, cuts);
        assert.equal(f.value, cost ?? null);
        assert.equal(f.bad, false);
      },
    ),
    { numRuns: 500 },
  );
});

test('a top-level cost that is not a non-negative number is bad, and an array body has none', () => {
  for (const body of ['{"cost":"0.1"}', '{"cost":-1}', '{"a":{"b":[1,2]},"cost":true}']) {
    const f = read(Buffer.from(body), [3, 9]);
    assert.equal(f.value, null, body);
    assert.equal(f.bad, true, body);
  }
  const array = read(Buffer.from('[{"cost":1}]'), [1]);
  assert.equal(array.value, null);
  assert.equal(array.bad, false);
});
