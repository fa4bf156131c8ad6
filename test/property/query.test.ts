// Credential-parameter removal as a property (docs/routes.md): whatever the
// spelling, no credential name survives; every other byte stays, in order.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { dropParams, hasParam, paramValue } from '../../src/request/query.ts';

const CREDENTIALS = ['token', 'xi-api-key'];

/** A spelling of `name` an upstream's parser would read as `name`: any case, any character percent-encoded, maybe `[]`. */
function spelling(name: string): fc.Arbitrary<string> {
  return fc
    .tuple(fc.array(fc.tuple(fc.boolean(), fc.boolean(), fc.boolean()), { minLength: name.length, maxLength: name.length }), fc.constantFrom('', '[]', '[0]'))
    .map(
      ([choices, suffix]) =>
        [...name]
          .map((ch, i) => {
            const [encode, upper, hexUpper] = choices[i] as [boolean, boolean, boolean];
            if (encode) {
              const hex = ch.charCodeAt(0).toString(16).padStart(2, '0');
              return `%${hexUpper ? hex.toUpperCase() : hex}`;
            }
            return upper ? ch.toUpperCase() : ch;
          })
          .join('') + suffix,
    );
}

// Names and values from characters that occur in real queries, `&` excluded (it separates).
const text = fc.string({ unit: fc.constantFrom(..."abcXYZ019-_.~%+=;:/?@!$'()*,[]".split('')), maxLength: 12 });
const otherName = text.filter((n) => {
  const canonical =
    n
      .replace(/%([0-9a-f]{2})/gi, (_, h: string) => String.fromCharCode(parseInt(h, 16)))
      .split('[')[0]
      ?.toLowerCase() ?? '';
  return !n.includes('=') && !CREDENTIALS.includes(canonical);
});
const param = (name: fc.Arbitrary<string>): fc.Arbitrary<string> =>
  fc
    .tuple(
      name,
      fc.option(
        text.map((v) => v),
        { nil: undefined },
      ),
    )
    .map(([n, v]) => (v === undefined ? n : `${n}=${v}`));
const credential = fc.constantFrom(...CREDENTIALS).chain((n) => param(spelling(n)).map((p) => ({ p, drop: true })));
const other = param(otherName).map((p) => ({ p, drop: false }));

test('dropParams removes every spelling of a credential parameter and keeps every other byte in order', () => {
  fc.assert(
    fc.property(fc.array(fc.oneof(credential, other), { minLength: 1, maxLength: 12 }), (params) => {
      const query = params.map((x) => x.p).join('&');
      const kept = params.filter((x) => !x.drop).map((x) => x.p);
      const out = dropParams(query, new Set(CREDENTIALS));
      if (params.every((x) => !x.drop)) assert.equal(out, query);
      else assert.equal(out, kept.join('&'));
      assert.equal(hasParam(out, new Set(CREDENTIALS)), false);
      assert.equal(
        hasParam(query, new Set(CREDENTIALS)),
        params.some((x) => x.drop),
      );
    }),
    { numRuns: 500 },
  );
});

test('paramValue finds a parameter by any spelling of its name', () => {
  fc.assert(
    fc.property(spelling('token'), fc.stringMatching(/^[0-9A-Za-z_]{1,40}$/), fc.array(other, { maxLength: 4 }), (name, value, before) => {
      const query = [...before.map((x) => x.p), `${name}=${value}`].join('&');
      assert.equal(paramValue(query, 'token'), value);
    }),
  );
});
