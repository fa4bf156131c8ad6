// Path checks as properties (docs/routes.md): no path with a dot-segment in any
// encoding passes; every accepted path reaches the upstream byte for byte.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { loadConfig } from '../../src/config/load.ts';
import { hasDotSegment, hasForbiddenEscape, matchRoute, routeTable, UPSTREAMS } from '../../src/request/routes.ts';
import { raw } from '../support/client.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

/** An independent oracle: would any server stack resolve a `.` or `..` segment here? */
function oracleHasDotSegment(path: string): boolean {
  const decoded = path.replace(/%([0-9a-f]{2})/gi, (_, h: string) => String.fromCharCode(parseInt(h, 16)));
  return decoded
    .replace(/\\/g, '/')
    .split('/')
    .map((segment) => segment.split(';')[0])
    .some((segment) => segment === '.' || segment === '..');
}

const dotty = fc.constantFrom('.', '..', '%2e', '%2E', '.%2e', '%2e.', '%2E%2e', '..;x', '%2e;y', '.%2E;');
const plain = fc
  .string({ unit: fc.constantFrom(..."abcXYZ09-_~!$&'()*+,=:@.%".split('')), minLength: 1, maxLength: 8 })
  .filter((s) => !/%(?![0-9a-fA-F]{2})/.test(s));
const separator = fc.constantFrom('/', '/', '/', '%2F', '%2f', '\\', '%5C');

const pathOf = (segments: fc.Arbitrary<string[]>): fc.Arbitrary<string> =>
  fc
    .tuple(segments, fc.array(separator, { minLength: 8, maxLength: 8 }))
    .map(([segs, seps]) => `/${segs.map((s, i) => (i === 0 ? s : `${seps[i % seps.length]}${s}`)).join('')}`);

test('hasDotSegment agrees with an independent decoder on every generated path', () => {
  fc.assert(
    fc.property(pathOf(fc.array(fc.oneof(plain, dotty), { minLength: 1, maxLength: 6 })), (path) => {
      assert.equal(hasDotSegment(path), oracleHasDotSegment(path), path);
    }),
    { numRuns: 2_000 },
  );
});

test('no path holding a dot-segment in any encoding is routed', () => {
  const config = loadConfig({ KEYWARD_SPEECH_KEY: 'k' }, () => '', '/', UPSTREAMS);
  const table = routeTable(config.routes);
  fc.assert(
    fc.property(pathOf(fc.array(plain, { maxLength: 3 })), dotty, pathOf(fc.array(plain, { maxLength: 3 })), (before, dot, after) => {
      const url = `/speech${before === '/' ? '' : before}/${dot}${after}`;
      const m = matchRoute(table, 'GET', url);
      assert.equal(m.route, null, url);
      assert.equal(m.error?.code, 'not_found', url);
    }),
    { numRuns: 1_000 },
  );
});

test('every accepted path reaches the upstream byte for byte (over the wire)', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ speech: up.url });
  try {
    await fc.assert(
      fc.asyncProperty(pathOf(fc.array(plain, { minLength: 1, maxLength: 5 })), fc.option(plain, { nil: undefined }), async (path, query) => {
        // Refused paths are the routing tests' business; an accepted one must arrive intact.
        fc.pre(!oracleHasDotSegment(path) && !hasForbiddenEscape(path));
        const target = `/speech${path}${query === undefined ? '' : `?${query}`}`;
        const before = up.requests.length;
        const out = await raw(gw.port, `GET ${target} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nconnection: close\r\n\r\n`);
        assert.match(out, /^HTTP\/1\.1 200 /, target);
        const seen = up.requests[before]?.url;
        // An empty query (`?` alone) is dropped with its `?`; everything else is as sent.
        assert.equal(seen, `${path}${query === undefined || query === '' ? '' : `?${query}`}`);
      }),
      { numRuns: 150 },
    );
  } finally {
    await gw.close();
    await up.close();
  }
});
