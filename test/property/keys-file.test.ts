// Keys-file parsing as a property (docs/keys.md): what is written reads back
// the same; anything else is refused with a KeysFileError naming the
// problem, never another exception, and never half-loaded.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { KeysFileCorrupt, parseKeysFile, serialiseKeysFile } from '../../src/keys/file-store.ts';
import type { KeyRecord } from '../../src/keys/keyset.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';

const hex = fc.stringMatching(/^[0-9a-f]{64}$/);
const date = fc.date({ min: new Date('2020-01-01'), max: new Date('2040-01-01'), noInvalidDate: true }).map((d) => d.toISOString());
const record: fc.Arbitrary<KeyRecord> = fc.record({
  id: fc.stringMatching(/^key_[0-9a-f]{12}$/),
  name: fc.stringMatching(/^[A-Za-z0-9][A-Za-z0-9._@:-]{0,20}$/),
  digest: hex.map((h) => `sha256:${h}`),
  created: date,
  expires: fc.option(date, { nil: null }),
  revoked: fc.option(date, { nil: null }),
  routes: fc.option(fc.subarray(['scraper', 'seo', 'speech']), { nil: null }),
  previous: fc.array(fc.record({ digest: hex.map((h) => `sha256:${h}`), until: date }), { maxLength: 2 }),
});

test('a written keys file reads back exactly', () => {
  fc.assert(
    fc.property(fc.array(record, { maxLength: 20 }), (records) => {
      assert.deepEqual(parseKeysFile(serialiseKeysFile(records), costRoutes(UPSTREAMS)), JSON.parse(JSON.stringify(records)));
    }),
  );
});

test('a truncated or altered keys file is refused with KeysFileCorrupt, never loaded in part', () => {
  fc.assert(
    fc.property(fc.array(record, { minLength: 1, maxLength: 10 }), fc.nat(), fc.string({ maxLength: 3 }), (records, at, junk) => {
      const text = serialiseKeysFile(records);
      const cut = at % (text.length - 2); // anything short of the closing `]}` (plus newline)
      for (const bad of [text.slice(0, cut), text.slice(0, cut) + junk + text.slice(cut + 1)]) {
        let parsed: KeyRecord[] | null = null;
        try {
          parsed = parseKeysFile(bad, costRoutes(UPSTREAMS));
        } catch (err) {
          assert.ok(err instanceof KeysFileCorrupt, String(err));
          continue;
        }
        // An alteration that still parses and checks must be a complete, valid document.
        assert.ok(Array.isArray(parsed));
        for (const r of parsed) assert.match(r.digest, /^sha256:/);
      }
    }),
    { numRuns: 500 },
  );
});

test('any JSON value is either a valid keys document or refused with KeysFileCorrupt', () => {
  fc.assert(
    fc.property(fc.jsonValue(), (value) => {
      try {
        parseKeysFile(JSON.stringify(value), costRoutes(UPSTREAMS));
      } catch (err) {
        assert.ok(err instanceof KeysFileCorrupt, String(err));
      }
    }),
  );
});
