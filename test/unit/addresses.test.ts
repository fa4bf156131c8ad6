// lib/addresses.ts: address ranges, and which address a key's allowlist is
// judged on when trusted proxies stand in front (docs/keys.md, "Allowed addresses").
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { allowedFrom, clientAddress, inRanges, parseRange, rangeSet } from '../../src/lib/addresses.ts';

test('ranges: IPv4 and IPv6 with a prefix, or one address; anything else is none', () => {
  assert.deepEqual(parseRange('10.0.0.0/8'), { address: '10.0.0.0', prefix: 8, family: 'ipv4' });
  assert.deepEqual(parseRange('2001:db8::/32'), { address: '2001:db8::', prefix: 32, family: 'ipv6' });
  assert.deepEqual(parseRange('192.0.2.7'), { address: '192.0.2.7', prefix: 32, family: 'ipv4' });
  for (const bad of ['10.0.0.0/33', '2001:db8::/129', 'example.com', '10.0.0/8', '10.0.0.0/', '10.0.0.0/-1', '', '1.2.3.4/8x'])
    assert.equal(parseRange(bad), null, bad);
  const set = rangeSet(['10.0.0.0/8', '2001:db8::/32']);
  assert.ok(set !== null);
  assert.equal(inRanges(set, '10.200.1.1'), true);
  assert.equal(inRanges(set, '::ffff:10.1.2.3'), true, 'an IPv4 address on a dual-stack socket');
  assert.equal(inRanges(set, '2001:db8:1::5'), true);
  assert.equal(inRanges(set, '11.0.0.1'), false);
  assert.equal(inRanges(set, 'not an address'), false);
  assert.equal(rangeSet([]), null);
});

test('the client address: the socket unless it is a trusted proxy; then X-Forwarded-For from the right past trusted hops', () => {
  const trusted = rangeSet(['127.0.0.0/8', '10.0.0.0/8']);
  // No trusted proxies: the header is never believed.
  assert.equal(clientAddress('127.0.0.1', '203.0.113.9', null), '127.0.0.1');
  // The socket is not a trusted proxy: a client's own header is ignored.
  assert.equal(clientAddress('198.51.100.4', '10.1.1.1', trusted), '198.51.100.4');
  // A trusted proxy: the nearest untrusted hop, whatever a client wrote further left.
  assert.equal(clientAddress('127.0.0.1', '10.9.9.9, 203.0.113.9, 10.0.0.2', trusted), '203.0.113.9');
  assert.equal(clientAddress('::ffff:127.0.0.1', ['203.0.113.1', '10.0.0.3'], trusted), '203.0.113.1');
  // Every hop trusted: the leftmost. No header: the socket.
  assert.equal(clientAddress('127.0.0.1', '10.0.0.5, 10.0.0.6', trusted), '10.0.0.5');
  assert.equal(clientAddress('127.0.0.1', undefined, trusted), '127.0.0.1');
  // Garbage where an address should be ends the walk, and matches no allowlist.
  assert.equal(clientAddress('127.0.0.1', '203.0.113.9, unknown', trusted), 'unknown');
});

test('a key without an allowlist has none; an empty one allows nothing; each record read once', () => {
  assert.equal(allowedFrom({}), null);
  assert.equal(allowedFrom({ limits: { rate: '1/s' } as never }), null);
  const empty = allowedFrom({ limits: { allowFrom: [] } });
  assert.ok(empty !== null && !inRanges(empty, '127.0.0.1'));
  const record = { limits: { allowFrom: ['127.0.0.2'] } };
  assert.equal(allowedFrom(record), allowedFrom(record));
});
