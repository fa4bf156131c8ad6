// The pipeline's guards (docs/routes.md, responses.md): each one alone, and
// their order: the first that objects answers.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { ERRORS } from '../../src/request/errors.ts';
import { GUARDS, runGuards, type GuardInput } from '../../src/request/guards.ts';
import type { KeyRecord } from '../../src/keys/keyset.ts';
import { generateToken } from '../../src/keys/token.ts';
import type { Route } from '../../src/request/routes.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';

const config = loadConfig({ KEYWARD_SCRAPER_TOKEN: 'scraper-secret', KEYWARD_SEO_URL: 'http://127.0.0.1:1' }, () => '', '/', UPSTREAMS);
const route = (name: string): Route => config.routes.find((r) => r.name === name) as Route;
const key: KeyRecord = {
  id: 'key_1',
  name: 'k',
  digest: `sha256:${'0'.repeat(64)}`,
  created: '2026-01-01T00:00:00Z',
  expires: null,
  revoked: null,
  routes: ['scraper'],
};

function input(over: Partial<GuardInput> = {}): GuardInput {
  return { headers: {}, route: route('scraper'), principal: key, path: '/v2/acts/x/runs', query: null, forwardQuery: '', maxBodyBytes: 1000, ...over };
}

test('a request every guard accepts passes', () => {
  assert.equal(runGuards(input()), null);
  assert.equal(GUARDS.length, 7);
});

test('each guard refuses what it is for', () => {
  assert.equal(runGuards(input({ path: `/v2/${generateToken()}` })), ERRORS.tokenInUrl);
  assert.equal(runGuards(input({ forwardQuery: `x=${generateToken()}` })), ERRORS.tokenInUrl);
  assert.equal(runGuards(input({ query: 'method=DELETE' })), ERRORS.methodOverride);
  assert.equal(runGuards(input({ query: 'a=1;method=DELETE' })), ERRORS.methodOverride);
  assert.equal(runGuards(input({ forwardQuery: 'a=1;token=x' })), ERRORS.credentialLookalike);
  assert.equal(runGuards(input({ headers: { x_http_method_override: 'DELETE' } })), ERRORS.methodOverride);
  assert.equal(runGuards(input({ route: route('speech'), principal: { ...key, routes: ['scraper'] } })), ERRORS.forbidden);
  assert.equal(runGuards(input({ route: route('seo'), principal: { ...key, routes: null } })), ERRORS.routeNotConfigured);
  assert.equal(runGuards(input({ headers: { 'transfer-encoding': 'gzip, chunked' } })), ERRORS.malformed);
  assert.equal(runGuards(input({ headers: { 'content-length': '1001' } })), ERRORS.payloadTooLarge);
  assert.equal(runGuards(input({ headers: { 'content-length': '1000', 'transfer-encoding': 'chunked' } })), null);
});

test('the first objection wins: token in URL, override, scope, configured, framing, size', () => {
  const everything: Partial<GuardInput> = {
    path: `/v2/${generateToken()}`,
    query: 'method=DELETE',
    route: route('seo'),
    principal: { ...key, routes: ['speech'] },
    headers: { 'x-http-method-override': 'DELETE', 'transfer-encoding': 'gzip, chunked', 'content-length': '5000' },
  };
  const expected = [ERRORS.tokenInUrl, ERRORS.methodOverride, ERRORS.forbidden, ERRORS.routeNotConfigured, ERRORS.malformed, ERRORS.payloadTooLarge];
  // Remove the causes one at a time, in order: each time the next guard answers.
  const steps: Array<Partial<GuardInput>> = [
    {},
    { path: '/v2/x' },
    { path: '/v2/x', query: null, headers: { 'transfer-encoding': 'gzip, chunked', 'content-length': '5000' } },
    { path: '/v2/x', query: null, headers: { 'transfer-encoding': 'gzip, chunked', 'content-length': '5000' }, principal: { ...key, routes: null } },
    {
      path: '/v2/x',
      query: null,
      headers: { 'transfer-encoding': 'gzip, chunked', 'content-length': '5000' },
      principal: { ...key, routes: null },
      route: route('scraper'),
    },
    { path: '/v2/x', query: null, headers: { 'content-length': '5000' }, principal: { ...key, routes: null }, route: route('scraper') },
  ];
  steps.forEach((step, i) => assert.equal(runGuards(input({ ...everything, ...step })), expected[i], `step ${i}`));
});
