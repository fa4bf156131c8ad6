// The usage page is built in a thread of its own (docs/limits.md, "The usage
// page"): with tens of thousands of keys and rows, reading the ledger's
// aggregates, matching keys to their limits and writing the HTML took a
// quarter of a second and more of the event loop that requests run on. The
// thread opens its own key store and ledger (read-only use) from the
// configuration; the event loop only sends the filter and gets the page's
// text back. Renders are bounded: requests for the same page share one, and
// more than a few different pages waiting are turned away (503, retry).
import { Worker } from 'node:worker_threads';
import type { Config } from '../config/load.ts';

/** What the thread needs to open the stores and label the page: plain data, sent once. */
export interface PageSource {
  readonly databaseUrl: string | null;
  readonly databaseTimeoutMs: number;
  readonly keysFile: string;
  readonly costRoutes: readonly string[];
  readonly routes: readonly string[];
  readonly units: Readonly<Record<string, string | null>>;
  /** Routes whose runs are settled after the fact: where a key's run cap applies. */
  readonly runRoutes: readonly string[];
}

/** The thread's source from the gateway's configuration. */
export function pageSource(
  config: Pick<Config, 'databaseUrl' | 'databaseTimeoutMs' | 'keysFile' | 'costRoutes' | 'routes'>,
  units: (route: string) => string | null,
): PageSource {
  return {
    databaseUrl: config.databaseUrl,
    databaseTimeoutMs: config.databaseTimeoutMs,
    keysFile: config.keysFile,
    costRoutes: [...config.costRoutes],
    routes: config.routes.map((r) => r.name),
    units: Object.fromEntries(config.routes.map((r) => [r.name, units(r.name)])),
    runRoutes: config.routes.filter((r) => r.cost?.runs !== undefined).map((r) => r.name),
  };
}

/** More different pages are waiting than the thread should queue. */
export class PageBusy extends Error {
  constructor() {
    super('the usage page is busy; try again in a moment');
  }
}

export interface PageThread {
  page(params: URLSearchParams): Promise<string>;
  close(): Promise<void>;
}

/** At most this many different pages in the thread's queue, the one rendering included. */
export const PAGE_QUEUE = 4;

export function pageThread(source: PageSource): PageThread {
  let worker: Worker | null = null;
  let asked = 0;
  const waiting = new Map<number, { resolve: (html: string) => void; reject: (err: Error) => void }>();
  const shared = new Map<string, Promise<string>>();
  const start = (): Worker => {
    const here = import.meta.url;
    // From source (tests, tsx) or built (dist): the worker is beside this module either way.
    const w = new Worker(new URL(here.endsWith('.ts') ? './page-worker.ts' : './page-worker.js', here), { workerData: source });
    w.unref();
    w.on('message', (m: { id: number; html?: string; error?: string }) => {
      const p = waiting.get(m.id);
      waiting.delete(m.id);
      if (m.error !== undefined) p?.reject(new Error(m.error));
      else p?.resolve(m.html ?? '');
    });
    const fail = (err: Error): void => {
      for (const p of waiting.values()) p.reject(err);
      waiting.clear();
      worker = null;
    };
    w.on('error', fail);
    w.on('exit', (code) => fail(new Error(`the usage page's thread exited (${code})`)));
    return w;
  };
  return {
    page(params) {
      const wanted = { key: params.get('key'), route: params.get('route') };
      const id = JSON.stringify(wanted);
      const same = shared.get(id);
      if (same !== undefined) return same;
      if (shared.size >= PAGE_QUEUE) return Promise.reject(new PageBusy());
      worker ??= start();
      const n = ++asked;
      const w = worker;
      const html = new Promise<string>((resolve, reject) => {
        waiting.set(n, { resolve, reject });
        w.postMessage({ id: n, ...wanted });
      }).finally(() => shared.delete(id));
      shared.set(id, html);
      return html;
    },
    async close() {
      const w = worker;
      worker = null;
      if (w !== null) await w.terminate();
    },
  };
}
