import { join } from 'node:path';
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parseKeysFile, serialiseKeysFile } from '../../src/keys/file-store.ts';
import { bearerToken } from '../../src/request/auth.ts';
import { KeySet, type KeyRecord } from '../../src/keys/keyset.ts';
import { generateToken, isWellFormed, TOKEN_LENGTH, tokenDigest } from '../../src/keys/token.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';

test('generated tokens have the documented shape and a valid checksum', () => {
  const seen = new Set<string>();
  for (let i = 0; i < 200; i++) {
    const t = generateToken();
    assert.match(t, /^kw_[0-9A-Za-z]{49}$/);
    assert.equal(t.length, TOKEN_LENGTH);
    assert.equal(isWellFormed(t), true);
    seen.add(t);
  }
  assert.equal(seen.size, 200);
});

test('a token with any one character changed fails its checksum', () => {
  const t = generateToken();
  for (let i = 3; i < t.length; i++) {
    const c = t[i] === 'a' ? 'b' : 'a';
    const bad = t.slice(0, i) + c + t.slice(i + 1);
    assert.equal(isWellFormed(bad), false, `position ${i}`);
  }
  assert.equal(isWellFormed(`${t}x`), false);
  assert.equal(isWellFormed(t.replace('kw_', 'kx_')), false);
  assert.equal(isWellFormed(''), false);
});

test('bearerToken reads the scheme case-insensitively and nothing else', () => {
  assert.equal(bearerToken('Bearer abc'), 'abc');
  assert.equal(bearerToken('bearer abc'), 'abc');
  assert.equal(bearerToken('BEARER   abc'), 'abc');
  assert.equal(bearerToken('Basic abc'), null);
  assert.equal(bearerToken('Bearer'), null);
  assert.equal(bearerToken('Bearer '), null);
  assert.equal(bearerToken('Bearer a b'), null);
  assert.equal(bearerToken('Bearerabc'), null);
  assert.equal(bearerToken(undefined), null);
});

function record(token: string, over: Partial<KeyRecord> = {}): KeyRecord {
  return {
    id: `key_${token.slice(3, 9)}`,
    name: 'n',
    digest: `sha256:${tokenDigest(token)}`,
    created: '2026-01-01T00:00:00.000Z',
    expires: null,
    revoked: null,
    ...over,
  };
}

test('KeySet finds active keys and refuses revoked, expired, unknown and malformed ones', () => {
  const [a, b, c, d] = [generateToken(), generateToken(), generateToken(), generateToken()];
  const now = Date.parse('2026-06-01T00:00:00Z');
  const set = new KeySet([
    record(a),
    record(b, { id: 'key_b', revoked: '2026-02-01T00:00:00.000Z' }),
    record(c, { id: 'key_c', expires: '2026-05-01T00:00:00.000Z' }),
  ]);
  const usable = (t: string, at: number): string | null => {
    const found = set.lookup(t, at);
    return found === null || found.refusal !== null ? null : found.principal.id;
  };
  assert.equal(usable(a, now), record(a).id);
  // Revoked and expired keys are still known, so a refusal can name them.
  assert.deepEqual(set.lookup(b, now), { principal: set.lookup(b, now)?.principal, refusal: 'revoked' });
  assert.equal(set.lookup(b, now)?.principal.id, 'key_b');
  assert.equal(set.lookup(c, now)?.refusal, 'expired');
  assert.equal(usable(c, Date.parse('2026-04-01T00:00:00Z')), 'key_c');
  assert.equal(set.lookup(d, now), null);
  // One character changed (never to itself): the checksum fails, no lookup.
  assert.equal(set.lookup(`${a.slice(0, -1)}${a.endsWith('x') ? 'y' : 'x'}`, now), null);
});

test('keys file round-trips and rejects malformed documents with a reason', () => {
  const r = record(generateToken());
  assert.deepEqual(parseKeysFile(serialiseKeysFile([r]), costRoutes(UPSTREAMS)), [r]);
  assert.deepEqual(parseKeysFile(serialiseKeysFile([]), costRoutes(UPSTREAMS)), []);
  const bad: Array<[string, RegExp]> = [
    ['{', /not valid JSON/],
    ['[]', /version/],
    ['{"version":1}', /"keys"/],
    ['{"version":1,"keys":[1]}', /not an object/],
    [JSON.stringify({ version: 1, keys: [{ ...r, id: '' }] }), /id/],
    [JSON.stringify({ version: 1, keys: [{ ...r, name: 3 }] }), /name/],
    [JSON.stringify({ version: 1, keys: [{ ...r, digest: 'md5:x' }] }), /digest/],
    [JSON.stringify({ version: 1, keys: [{ ...r, created: 'soon' }] }), /created/],
    [JSON.stringify({ version: 1, keys: [{ ...r, expires: 'x' }] }), /expires/],
    [JSON.stringify({ version: 1, keys: [{ ...r, revoked: 5 }] }), /revoked/],
  ];
  for (const [text, reason] of bad) assert.throws(() => parseKeysFile(text, costRoutes(UPSTREAMS)), reason, text);
});

test('a keys file with a repeated id loads, but is never written back', async () => {
  const { mkdtempSync, writeFileSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const { FileKeyStore } = await import('../../src/keys/file-store.ts');
  const dir = mkdtempSync(join(tmpdir(), 'keyward-unit-'));
  try {
    const r = record(generateToken());
    const path = join(dir, 'keys.json');
    writeFileSync(path, serialiseKeysFile([r, { ...r, name: 'twin' }]));
    const store = new FileKeyStore(path, costRoutes(UPSTREAMS));
    assert.equal((await store.load()).length, 2);
    await assert.rejects(
      store.update((records) => ({ records, result: null })),
      /appears twice/,
    );
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('KeySet finds every one of thousands of keys and none of the others (probing, wrap-around)', () => {
  const tokens = Array.from({ length: 3000 }, () => generateToken());
  const records = tokens.map((t, i) => record(t, { id: `key_${i}`, revoked: i % 7 === 0 ? '2026-01-01T00:00:00.000Z' : null }));
  const set = new KeySet(records, 0);
  assert.equal(set.size, tokens.filter((_, i) => i % 7 !== 0).length);
  tokens.forEach((t, i) => {
    assert.equal(set.lookup(t, 0)?.principal.id, `key_${i}`);
    assert.equal(set.lookup(t, 0)?.refusal, i % 7 === 0 ? 'revoked' : null);
  });
  for (let i = 0; i < 3000; i++) assert.equal(set.lookup(generateToken(), 0), null);
  assert.equal(new KeySet([]).lookup(tokens[0] as string, 0), null);
});

test('KeySet.next: a revocation or scope change shares the digest index; rotation, creation and removal rebuild it; each answers as a fresh set would', () => {
  const now = Date.parse('2026-06-01T00:00:00Z');
  const tokens = Array.from({ length: 50 }, () => generateToken());
  const rec = (t: string, i: number): KeyRecord => ({
    id: `key_${i}`,
    name: `k${i}`,
    digest: `sha256:${tokenDigest(t)}`,
    created: '2026-01-01T00:00:00.000Z',
    expires: null,
    revoked: null,
  });
  const records = tokens.map(rec);
  const first = new KeySet(records, now);
  // Revoke one, narrow another, expire a third: same digests, same places.
  const changed = records.slice();
  changed[3] = { ...(changed[3] as KeyRecord), revoked: '2026-05-01T00:00:00.000Z' };
  changed[4] = { ...(changed[4] as KeyRecord), routes: ['seo'] };
  changed[5] = { ...(changed[5] as KeyRecord), expires: '2026-05-01T00:00:00.000Z' };
  const second = first.next(changed, now);
  const fresh = new KeySet(changed, now);
  assert.equal(second.size, 48); // 50, less one revoked and one expired
  for (const t of tokens) assert.deepEqual(second.lookup(t, now), fresh.lookup(t, now));
  assert.equal(second.lookup(tokens[3] as string, now)?.refusal, 'revoked');
  assert.deepEqual(second.lookup(tokens[4] as string, now)?.principal.routes, ['seo']);
  assert.equal(second.lookup(tokens[5] as string, now)?.refusal, 'expired');
  assert.equal(first.lookup(tokens[3] as string, now)?.refusal, null, 'the earlier set is untouched');
  // Rotation with a grace period: the new token opens the key, the old one until its time.
  const rotatedToken = generateToken();
  const rotated = changed.slice();
  rotated[6] = {
    ...(rotated[6] as KeyRecord),
    digest: `sha256:${tokenDigest(rotatedToken)}`,
    previous: [{ digest: (rotated[6] as KeyRecord).digest, until: '2026-06-02T00:00:00.000Z' }],
  };
  const third = second.next(rotated, now);
  assert.equal(third.lookup(rotatedToken, now)?.principal.id, 'key_6');
  assert.equal(third.lookup(tokens[6] as string, now)?.principal.id, 'key_6');
  assert.equal(third.lookup(tokens[6] as string, Date.parse('2026-06-03T00:00:00Z')), null);
  // The grace period's end changed (rotate again with another grace): not the same digests.
  const regraced = rotated.slice();
  regraced[6] = { ...rotated[6], previous: [{ digest: rotated[6].digest.replace(/.$/, '0'), until: '2026-06-02T00:00:00.000Z' }] };
  assert.equal(third.next(regraced, now).lookup(tokens[6] as string, now), null);
  // A key added, a key removed.
  const extra = generateToken();
  const grown = [...rotated, rec(extra, 50)];
  assert.equal(third.next(grown, now).lookup(extra, now)?.principal.id, 'key_50');
  const shrunk = rotated.filter((_, i) => i !== 7);
  const fourth = third.next(shrunk, now);
  assert.equal(fourth.lookup(tokens[7] as string, now), null);
  assert.equal(fourth.lookup(tokens[8] as string, now)?.principal.id, 'key_8');
});

test('a grace date that is not a date ends the grace (fail closed); a grace entry without a digest opens nothing and breaks nothing', () => {
  const [current, old, other] = [generateToken(), generateToken(), generateToken()];
  const now = Date.parse('2026-06-01T00:00:00Z');
  for (const until of [12345, 'never', null, '', undefined]) {
    const set = new KeySet(
      [
        record(current, { previous: [{ digest: `sha256:${tokenDigest(old)}`, until } as never, { until: '2099-01-01T00:00:00Z' } as never] }),
        record(other, { id: 'key_other' }),
      ],
      now,
    );
    assert.equal(set.lookup(old, now), null, `until ${JSON.stringify(until)}: the old token opens nothing`);
    assert.equal(set.lookup(current, now)?.refusal, null, 'the current token still works');
    assert.equal(set.lookup(other, now)?.refusal, null, 'the rest of the set is intact');
  }
});
