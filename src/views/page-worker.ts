// The usage page's thread (page-thread.ts): its own key store and ledger,
// opened as the gateway opens them, the page built and rendered here. Key
// records are read from the store at most every 10 s. Messages: {id, key,
// route} in, {id, html} or {id, error} out.
import { existsSync } from 'node:fs';
import { parentPort, workerData } from 'node:worker_threads';
import type { KeyRecord } from '../keys/keyset.ts';
import { openKeyStore } from '../keys/open.ts';
import { sharedUsageStore } from '../ledger/open.ts';
import { MemoryUsageStore } from '../ledger/memory-store.ts';
import { renderPage } from './page.ts';
import type { PageSource } from './page-thread.ts';
import { usagePage } from './report.ts';
import { SqliteUsageStore, usagePath } from '../ledger/sqlite-store.ts';
import type { UsageStore } from '../ledger/store.ts';

const source = workerData as PageSource;
const keys = openKeyStore({
  databaseUrl: source.databaseUrl,
  databaseTimeoutMs: source.databaseTimeoutMs,
  keysFile: source.keysFile,
  costRoutes: source.costRoutes,
});
let usage: UsageStore | null = sharedUsageStore(keys) ?? null;
/** The ledger: the key store's own (PostgreSQL), else the SQLite file beside the keys file once it exists. */
const ledger = (): UsageStore => {
  if (usage === null && existsSync(usagePath(source.keysFile))) usage = new SqliteUsageStore(usagePath(source.keysFile));
  return usage ?? new MemoryUsageStore();
};
let records: { at: number; list: Promise<readonly KeyRecord[]> } | null = null;
const list = (): Promise<readonly KeyRecord[]> => {
  if (records === null || Date.now() - records.at > 10_000) {
    const read = { at: Date.now(), list: keys.load() };
    // A failed read is not kept: the next page tries again.
    read.list.catch(() => (records = records === read ? null : records));
    records = read;
  }
  return records.list;
};
const units = (route: string): string | null => source.units[route] ?? null;
let page: ((params: URLSearchParams) => Promise<string>) | null = null;
let pageOf: UsageStore | null = null;

parentPort?.on('message', (m: { id: number; key: string | null; route: string | null }) => {
  const store = ledger();
  if (page === null || pageOf !== store) {
    page = usagePage(store, list, source.routes, units, renderPage, source.runRoutes);
    pageOf = store;
  }
  const params = new URLSearchParams();
  if (m.key !== null) params.set('key', m.key);
  if (m.route !== null) params.set('route', m.route);
  page(params).then(
    (html) => parentPort?.postMessage({ id: m.id, html }),
    (err: Error) => parentPort?.postMessage({ id: m.id, error: err.message }),
  );
});
