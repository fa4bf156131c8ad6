// The usage page's reads of the SQLite ledger, in a worker thread: node:sqlite
// is synchronous, and an aggregate over a month of a large ledger takes a
// few hundred milliseconds that must never stall the event loop requests run
// on. Its own read-only connection (WAL: readers never wait for the writer).
// Messages: {id, sql, params} in, {id, rows} or {id, error} out.
import { DatabaseSync } from 'node:sqlite';
import { parentPort, workerData } from 'node:worker_threads';
import { asError } from '../lib/error.ts';

const db = new DatabaseSync(workerData as string, { readOnly: true });
const statements = new Map<string, ReturnType<DatabaseSync['prepare']>>();

parentPort?.on('message', (m: { id: number; sql: string; params: Array<string | number | null> }) => {
  try {
    let st = statements.get(m.sql);
    if (st === undefined) statements.set(m.sql, (st = db.prepare(m.sql)));
    parentPort?.postMessage({ id: m.id, rows: st.all(...m.params) });
  } catch (err) {
    parentPort?.postMessage({ id: m.id, error: asError(err).message });
  }
});
