// Token format, Authorization parsing and token-shape detection as properties (docs/authentication.md).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { basicPassword, bearerToken } from '../../src/request/auth.ts';
import {
  containsTokenLike,
  generateAdminToken,
  generateToken,
  isWellFormed,
  isWellFormedAdmin,
  redactTokens,
  sameText,
  tokenDigestBytes,
  TokenMemo,
} from '../../src/keys/token.ts';

const ALPHABET = '0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
const tokens = fc.constant(null).map(() => generateToken());
const adminTokens = fc.constant(null).map(() => generateAdminToken());

test('a client token is never an admin token and an admin token never a client token, whatever one character changed', () => {
  fc.assert(
    fc.property(tokens, adminTokens, fc.nat(), (client, admin, at) => {
      assert.equal(isWellFormed(client), true);
      assert.equal(isWellFormedAdmin(admin), true);
      assert.equal(isWellFormedAdmin(client), false);
      assert.equal(isWellFormed(admin), false);
      // The admin prefix spliced onto a client token's body, and the other way round: neither shape.
      assert.equal(isWellFormedAdmin(`kwa_${client.slice(3)}`), false);
      assert.equal(isWellFormed(`kw_${admin.slice(4)}`), false);
      const i = 4 + (at % 49);
      const c = admin[i] === 'a' ? 'b' : 'a';
      assert.equal(isWellFormedAdmin(admin.slice(0, i) + c + admin.slice(i + 1)), false);
    }),
    { numRuns: 300 },
  );
});

test('every generated token is well formed; any one changed character breaks its checksum or shape', () => {
  fc.assert(
    fc.property(tokens, fc.nat(), fc.constantFrom(...ALPHABET.split('')), (token, at, ch) => {
      assert.equal(isWellFormed(token), true);
      const i = 3 + (at % (token.length - 3));
      fc.pre(token[i] !== ch);
      assert.equal(isWellFormed(token.slice(0, i) + ch + token.slice(i + 1)), false);
    }),
    { numRuns: 1_000 },
  );
});

test('sameText is string equality, for any strings and for tokens one character apart', () => {
  fc.assert(fc.property(fc.string(), fc.string(), (a, b) => assert.equal(sameText(a, b), a === b)));
  fc.assert(
    fc.property(tokens, fc.nat(), fc.constantFrom(...ALPHABET.split('')), (token, at, ch) => {
      const i = at % token.length;
      const other = token.slice(0, i) + ch + token.slice(i + 1);
      assert.equal(sameText(token, other), token === other);
      assert.equal(sameText(token, token.slice(0, i)), i === token.length);
    }),
  );
});

test("a connection's memo gives a digest for the token it remembers, and for no other", () => {
  fc.assert(
    fc.property(tokens, fc.string({ maxLength: 60 }), (token, other) => {
      const memo = new TokenMemo();
      assert.equal(memo.digestOf(token), null);
      memo.remember(token, tokenDigestBytes(token));
      assert.deepEqual(memo.digestOf(token), tokenDigestBytes(token));
      assert.equal(memo.digestOf(other), other === token ? memo.digestOf(token) : null);
    }),
  );
});

test('random strings are not tokens', () => {
  fc.assert(fc.property(fc.string({ maxLength: 80 }), (s) => assert.equal(isWellFormed(s), false)));
});

test('Bearer parsing: any case of the scheme, any run of spaces, the token back exactly', () => {
  const scheme = fc.array(fc.boolean(), { minLength: 6, maxLength: 6 }).map((up) => [...'bearer'].map((c, i) => (up[i] ? c.toUpperCase() : c)).join(''));
  const token = fc.string({ unit: fc.constantFrom(...`${ALPHABET}_-.~+/=`.split('')), minLength: 1, maxLength: 60 });
  fc.assert(
    fc.property(scheme, fc.integer({ min: 1, max: 4 }), token, (s, spaces, t) => {
      assert.equal(bearerToken(`${s}${' '.repeat(spaces)}${t}`), t);
      assert.equal(bearerToken(`${s}${' '.repeat(spaces)}${t} extra`), null);
      assert.equal(bearerToken(`Basic ${t}`), null);
    }),
  );
  fc.assert(
    fc.property(fc.string(), (h) => {
      const t = bearerToken(h);
      if (t !== null) assert.ok(h.toLowerCase().startsWith('bearer ') && h.endsWith(t) && !t.includes(' '));
    }),
  );
});

test('Basic parsing returns the password for any login without a colon', () => {
  fc.assert(
    fc.property(
      fc.string().filter((l) => !l.includes(':')),
      fc.string(),
      (login, password) => {
        fc.pre(Buffer.from(`${login}:${password}`, 'utf8').toString('utf8') === `${login}:${password}`);
        assert.equal(basicPassword(`Basic ${Buffer.from(`${login}:${password}`).toString('base64')}`), password);
      },
    ),
  );
});

/** A client token or an admin token (kwa_), as it may be disguised: any case, any characters percent-encoded. */
const disguised = fc
  .tuple(fc.oneof(tokens, adminTokens), fc.array(fc.tuple(fc.boolean(), fc.boolean()), { minLength: 53, maxLength: 53 }))
  .map(([t, choices]) =>
    [...t]
      .map((ch, i) => {
        const [encode, flip] = choices[i] as [boolean, boolean];
        const c = flip ? (ch === ch.toLowerCase() ? ch.toUpperCase() : ch.toLowerCase()) : ch;
        return encode ? `%${c.charCodeAt(0).toString(16)}` : c;
      })
      .join(''),
  );

test('a client or admin token in any case or percent-encoding is found and redacted wherever it stands', () => {
  fc.assert(
    fc.property(fc.string({ maxLength: 20 }), disguised, fc.string({ maxLength: 20 }), (before, t, after) => {
      assert.equal(containsTokenLike(before + t + after), true);
      const red = redactTokens(before + t + after);
      assert.equal(containsTokenLike(red), false, red);
      assert.ok(red.includes('kw_[redacted]'));
    }),
    { numRuns: 1_000 },
  );
});
