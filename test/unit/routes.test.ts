import assert from 'node:assert/strict';
import { test } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { ERRORS } from '../../src/request/errors.ts';
import { hasDotSegment, matchRoute, routeTable, UPSTREAMS } from '../../src/request/routes.ts';

const config = loadConfig({ KEYWARD_SPEECH_KEY: 'k', KEYWARD_SCRAPER_TOKEN: 't' }, () => '', '/', UPSTREAMS);
const table = routeTable(config.routes);

test('matchRoute splits prefix, path and raw query', () => {
  const m = matchRoute(table, 'POST', '/scraper/v2/acts/a~b/runs?timeout=60&x');
  assert.equal(m.error, null);
  assert.equal(m.route?.name, 'scraper');
  assert.equal(m.path, '/v2/acts/a~b/runs');
  assert.equal(m.query, 'timeout=60&x');
  const n = matchRoute(table, 'GET', '/speech/v1/voices');
  assert.equal(n.route?.name, 'speech');
  assert.equal(n.query, null);
  assert.equal(matchRoute(table, 'GET', '/seo/v3/x?').query, '');
});

test('matchRoute answers 404 for anything outside the table', () => {
  const noRoute = ['/', '', '*', 'http://evil.example/seo/x', '/seo', '/seo/', '/seo/?a=1', '/seox/v3', '/SEO/v3', '/other/x', '//seo/v3'];
  for (const url of noRoute) assert.equal(matchRoute(table, 'GET', url).error, ERRORS.noRoute, url);
});

test("matchRoute enforces each route's method list", () => {
  const allowed: Record<string, string[]> = {
    '/scraper/v2/x': ['POST'],
    '/seo/v3/x': ['GET', 'POST'],
    '/speech/v1/x': ['GET', 'POST', 'PATCH', 'DELETE'],
  };
  const all = ['GET', 'HEAD', 'POST', 'PUT', 'PATCH', 'DELETE', 'OPTIONS', 'TRACE'];
  for (const [url, methods] of Object.entries(allowed)) {
    for (const method of all) {
      const m = matchRoute(table, method, url);
      assert.equal(m.error === null, methods.includes(method), `${method} ${url}`);
      if (m.error !== null) assert.equal(m.error, ERRORS.methodNotOnRoute);
    }
  }
});

test('dot-segments are refused in every spelling, look-alikes are not', () => {
  const refused = [
    '/..',
    '/.',
    '/a/../b',
    '/a/./b',
    '/a/..',
    '/%2e%2E/x',
    '/%2E/x',
    '/a/.%2e/b',
    '/a\\..\\b',
    '/a%2f..%2fb',
    '/a%5C..%5Cb',
    '/..;/x',
    '/a/..%3bx',
    '/a/..#x',
  ];
  for (const p of refused) {
    assert.equal(hasDotSegment(p), true, p);
    assert.equal(matchRoute(table, 'GET', `/seo${p}`).error, ERRORS.dotSegment, p);
  }
  const fine = ['/a..b/c', '/.well-known/x', '/a/...', '/v1/file.mp3', '/a%2eb', '/%2e%2e%2e', '/a/..b'];
  for (const p of fine) assert.equal(hasDotSegment(p), false, p);
});
