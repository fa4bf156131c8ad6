// The PostgreSQL driver's unhandled rejection on a connection lost while it
// set itself up (lib/driver-loss.ts) is told apart from any other: a gateway
// outlives the first, and still ends on the second.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { isDriverConnectionLoss, isDriverWriteAfterClose } from '../../src/lib/driver-loss.ts';

const withCode = (code: string): Error => Object.assign(new Error(`write ${code} 127.0.0.1:5432`), { code });

test('a connection destroyed, reset, refused or terminated by the server is the driver losing it', () => {
  for (const code of ['CONNECTION_DESTROYED', 'CONNECTION_CLOSED', 'ECONNRESET', 'ECONNREFUSED', '57P01', '57014'])
    assert.equal(isDriverConnectionLoss(withCode(code)), true, code);
});

test('anything else is not: a flaw of its own, a SQL error, a value that is no Error', () => {
  assert.equal(isDriverConnectionLoss(new TypeError('x is undefined')), false);
  assert.equal(isDriverConnectionLoss(withCode('23505')), false, 'a unique violation');
  assert.equal(isDriverConnectionLoss(withCode('KEYWARD_ERR_CONFIG')), false);
  assert.equal(isDriverConnectionLoss({ code: 'ECONNRESET' }), false, 'not an Error');
  assert.equal(isDriverConnectionLoss(Object.assign(new Error('x'), { code: 57014 })), false, 'a code that is not a string');
  assert.equal(isDriverConnectionLoss(undefined), false);
});

test("the driver's deferred write after its connection closed is told apart from any other TypeError by its message and frame", () => {
  const thrown = new TypeError("Cannot read properties of null (reading 'write')");
  thrown.stack = `${thrown.name}: ${thrown.message}\n    at Immediate.nextWrite (file:///srv/node_modules/postgres/src/connection.js:255:22)\n    at process.processImmediate (node:internal/timers:574:21)`;
  assert.equal(isDriverWriteAfterClose(thrown), true);
  // The same message from keyward's own code, or another module's nextWrite: not the driver's.
  const ours = new TypeError("Cannot read properties of null (reading 'write')");
  ours.stack = `${ours.name}: ${ours.message}\n    at Relay.nextWrite (file:///srv/dist/request/relay.js:10:3)`;
  assert.equal(isDriverWriteAfterClose(ours), false);
  const other = new TypeError('x is not a function');
  other.stack = thrown.stack.replace(thrown.message, other.message);
  assert.equal(isDriverWriteAfterClose(other), false);
  assert.equal(isDriverWriteAfterClose(new Error("Cannot read properties of null (reading 'write')")), false);
});
