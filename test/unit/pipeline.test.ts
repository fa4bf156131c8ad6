// The pipeline's decisions (request/pipeline.ts) without sockets
// (docs/authentication.md, docs/routes.md): who is asking, and where an
// authenticated request goes: its route, its guards and its target, in order.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { KeySet, type KeyRecord } from '../../src/keys/keyset.ts';
import { generateToken, tokenDigest, tokenDigestBytes, TokenMemo } from '../../src/keys/token.ts';
import { CredentialBoard } from '../../src/request/credentials.ts';
import { buildRuntime } from '../../src/process/runtime.ts';
import { Capacity } from '../../src/capacity/capacity.ts';
import { ERRORS } from '../../src/request/errors.ts';
import { authenticate, routeOf } from '../../src/request/pipeline.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';

const config = loadConfig(
  { KEYWARD_SCRAPER_TOKEN: 'scraper-secret', KEYWARD_SPEECH_KEY: 'speech-secret', KEYWARD_SEO_URL: 'http://127.0.0.1:1' },
  () => '',
  '/',
  UPSTREAMS,
);
const rt = buildRuntime(config, new CredentialBoard(), new Capacity(config, () => true));
const token = generateToken();
const revokedToken = generateToken();
const key: KeyRecord = {
  id: 'key_1',
  name: 'k',
  digest: `sha256:${tokenDigest(token)}`,
  created: '2026-01-01T00:00:00Z',
  expires: null,
  revoked: null,
  routes: ['scraper', 'seo'],
};
const keys = new KeySet([key, { ...key, id: 'key_2', digest: `sha256:${tokenDigest(revokedToken)}`, revoked: new Date(Date.now() - 1_000).toISOString() }]);

test('authenticate: missing, malformed, unknown, refused with the key named, and found', () => {
  const now = Date.now();
  assert.equal(authenticate({}, '/scraper/v2/x', rt.table, keys, now), 'missing');
  assert.equal(authenticate({ authorization: 'Bearer nope' }, '/scraper/v2/x', rt.table, keys, now), 'malformed');
  assert.equal(authenticate({ authorization: `Bearer ${generateToken()}` }, '/scraper/v2/x', rt.table, keys, now), 'unknown');
  const revoked = authenticate({ authorization: `Bearer ${revokedToken}` }, '/scraper/v2/x', rt.table, keys, now);
  assert.ok(typeof revoked !== 'string');
  assert.equal(revoked.refusal, 'revoked');
  assert.equal(revoked.principal.id, 'key_2');
  const found = authenticate({ authorization: `Bearer ${token}` }, '/scraper/v2/x', rt.table, keys, now);
  assert.ok(typeof found !== 'string');
  assert.equal(found.refusal, null);
  assert.equal(found.principal.id, 'key_1');
});

test("authenticate with a connection's memo: the same token's digest is taken from it, and still looked up in the key set in force", () => {
  const now = Date.now();
  const memo = new TokenMemo();
  const first = authenticate({ authorization: `Bearer ${token}` }, '/scraper/v2/x', rt.table, keys, now, memo);
  assert.ok(typeof first !== 'string');
  assert.equal(first.principal.id, 'key_1');
  assert.deepEqual(memo.digestOf(token), tokenDigestBytes(token));
  // Proof that a remembered digest is used as it is, not worked out again:
  // a memo holding another key's digest for this token names that key.
  const planted = new TokenMemo();
  planted.remember(token, tokenDigestBytes(revokedToken));
  const fromMemo = authenticate({ authorization: `Bearer ${token}` }, '/scraper/v2/x', rt.table, keys, now, planted);
  assert.ok(typeof fromMemo !== 'string');
  assert.deepEqual([fromMemo.principal.id, fromMemo.refusal], ['key_2', 'revoked']);
  // The key set in force decides: the same memo against a set where the key is revoked.
  const revokedSet = new KeySet([{ ...key, revoked: new Date(now - 1_000).toISOString() }]);
  const later = authenticate({ authorization: `Bearer ${token}` }, '/scraper/v2/x', rt.table, revokedSet, now, memo);
  assert.ok(typeof later !== 'string');
  assert.equal(later.refusal, 'revoked');
  // A malformed token is refused and leaves the memo as it was; another token replaces it.
  assert.equal(authenticate({ authorization: `Bearer ${token.slice(0, -1)}!` }, '/scraper/v2/x', rt.table, keys, now, memo), 'malformed');
  assert.deepEqual(memo.digestOf(token), tokenDigestBytes(token));
  const other = generateToken();
  assert.equal(authenticate({ authorization: `Bearer ${other}` }, '/scraper/v2/x', rt.table, keys, now, memo), 'unknown');
  assert.equal(memo.digestOf(token), null);
  assert.deepEqual(memo.digestOf(other), tokenDigestBytes(other));
});

test('routeOf: a route, the query without the client credential, and the target with the master credential', () => {
  const step = routeOf(rt, 'POST', '/scraper/v2/acts/a/runs?token=x&limit=2', {}, key);
  assert.equal(step.error, null);
  if (step.error !== null) return;
  assert.equal(step.route.name, 'scraper');
  assert.equal(step.path, '/v2/acts/a/runs');
  assert.equal(step.forwardQuery, 'limit=2');
  assert.equal(step.route.credentials[0]?.header[1], 'Bearer scraper-secret');
});

test('routeOf: each refusal in the order the pipeline meets them, with the route when one matched', () => {
  assert.deepEqual(routeOf(rt, 'GET', '/nowhere/x', {}, key), { error: ERRORS.noRoute, route: null });
  assert.deepEqual(routeOf(rt, 'GET', '/scraper/v2/x', {}, key), { error: ERRORS.methodNotOnRoute, route: null });
  const scope = routeOf(rt, 'GET', '/speech/v1/voices', {}, key);
  assert.equal(scope.error, ERRORS.forbidden);
  assert.equal(scope.route?.name, 'speech');
  // The seo route is named by the key but has no secret here: not configured, not forwarded.
  const unconfigured = routeOf(rt, 'GET', '/seo/v3/x', {}, key);
  assert.equal(unconfigured.error, ERRORS.routeNotConfigured);
  assert.equal(unconfigured.route?.name, 'seo');
  assert.equal(routeOf(rt, 'POST', `/scraper/v2/${token}`, {}, key).error, ERRORS.tokenInUrl);
  assert.equal(routeOf(rt, 'POST', '/scraper/v2/x', { 'content-length': String(config.maxBodyBytes + 1) }, key).error, ERRORS.payloadTooLarge);
});
