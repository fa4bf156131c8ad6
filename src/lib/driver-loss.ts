// A connection the PostgreSQL driver lost while it set itself up. postgres.js
// fetches the server's array types as the first query of every new
// connection and drops that promise (ReadyForQuery calls the async
// fetchArrayTypes() without a handler:
// https://github.com/porsager/postgres/issues/1192, #1205, #1223, open in
// 3.4.9). A connection ended by a pool replaced past its deadline, reset by a
// server that stopped, or terminated by an administrator at that moment
// rejects it unhandled, and Node ends the process for it: a gateway would die
// of a database it is built to outlive. Nothing of keyward's waits on that
// query (the lint holds src/ to handling every promise of its own), and the
// driver replaces the connection, so such a rejection is said and passed over.

/** Errors a lost or refused database connection rejects with: the driver's own codes, the socket's, and the server's "terminated" and "cancelled" SQLSTATEs. */
const LOSS = new Set([
  'CONNECTION_DESTROYED',
  'CONNECTION_CLOSED',
  'CONNECTION_ENDED',
  'CONNECT_TIMEOUT',
  'ECONNRESET',
  'ECONNREFUSED',
  'EPIPE',
  'ETIMEDOUT',
  '57P01',
  '57P02',
  '57P03',
  '57014',
]);

/** Whether an unhandled rejection is the driver's lost connection (see above), not a flaw of keyward's. */
export function isDriverConnectionLoss(err: unknown): boolean {
  return err instanceof Error && 'code' in err && typeof err.code === 'string' && LOSS.has(err.code);
}

/**
 * The driver's write after its connection closed. postgres.js defers a
 * small write to a setImmediate; when the connection closes first (a server
 * that stops, a backend terminated) the deferred write reads the socket it
 * has just set to null and throws from the immediate, outside any query's
 * promise (https://github.com/porsager/postgres/issues/1154, #1208, open in
 * 3.4.9). The query it belonged to has been rejected with CONNECTION_CLOSED
 * already, or ends at keyward's own query deadline (lib/deadline.ts), so the
 * exception is said and passed over rather than ending the gateway.
 */
export function isDriverWriteAfterClose(err: unknown): boolean {
  return (
    err instanceof TypeError &&
    /reading 'write'|evaluating 'socket\.write'/.test(err.message) &&
    /\bnextWrite\b[^\n]*postgres[\\/]src[\\/]connection\.js/.test(err.stack ?? '')
  );
}
