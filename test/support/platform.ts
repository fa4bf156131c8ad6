// A recording stand-in for the scraper platform's runs (docs/limits.md,
// "Scraper runs"): a run-start answers a run object, `GET …/actor-runs/{id}`
// answers the run as it stands. The actor's name says how its runs behave:
// `quick` ends before it is first asked about, `slow` runs for `slowMs`,
// `never` never ends, `fails` ends FAILED with a cost; `…-N.NN` sets the
// cost (default 0.25). A run costs at most its start's maxTotalChargeUsd,
// as the platform caps a pay-per-event run. `down` makes the platform answer
// every question about a run with a 503, `garbage` with a body that is no
// run object.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { startUpstream, type MockUpstream } from './upstream.ts';

export interface Platform {
  up: MockUpstream;
  /** Runs started, by id: their actor, cap, and how often they were asked about. */
  readonly runs: Map<string, { actor: string; cap: number; started: number; asked: number; cost: number; query: string; owner: string }>;
  /** Questions about a run asked with another account's token (answered 404, as the platform does). */
  foreign: number;
  /** The queries of synchronous runs, in order. */
  readonly syncQueries: string[];
  down: boolean;
  garbage: boolean;
  slowMs: number;
  /** How long a run-start waits before it answers (the run is started at once, as the platform does). */
  startDelayMs: number;
  /** Schedules, webhooks and builds created or changed: spend that would come later. */
  readonly later: string[];
  close(): Promise<void>;
}

const json = (res: ServerResponse, status: number, body: unknown): void => {
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
  res.end(text);
};

export async function startPlatform(): Promise<Platform> {
  let next = 0;
  const p: Platform = {
    up: null as unknown as MockUpstream,
    runs: new Map(),
    syncQueries: [],
    down: false,
    garbage: false,
    slowMs: 1_500,
    startDelayMs: 0,
    later: [],
    foreign: 0,
    close: () => p.up.close(),
  };
  const startRun = (actor: string, url: URL, id: string, owner = ''): void => {
    const capText = url.searchParams.get('maxTotalChargeUsd');
    const cap = capText === null ? Infinity : Number(capText);
    const price = Number(/-(\d+\.\d+)$/.exec(actor)?.[1] ?? '0.25');
    p.runs.set(id, { actor, cap, started: Date.now(), asked: 0, cost: Math.min(price, cap), query: url.search, owner });
  };
  const handler = (req: IncomingMessage, res: ServerResponse): void => {
    req.resume();
    req.on('end', () => {
      const url = new URL(req.url ?? '/', 'http://platform');
      // A lenient router: escapes decoded, case folded, a trailing slash ignored.
      const path = decodeURIComponent(url.pathname).toLowerCase().replace(/\/+$/, '');
      const start = /^(?:\/v2)?\/(?:acts|actor-tasks)\/([^/]+)\/runs$/.exec(path);
      if (req.method === 'POST' && start !== null) {
        const actor = start[1] as string;
        const id = `run${String(++next).padStart(5, '0')}x${Math.random().toString(36).slice(2, 8)}`;
        startRun(actor, url, id, req.headers.authorization ?? '');
        const answer = (): void => json(res, 201, { data: { id, actId: actor, status: 'READY', usageTotalUsd: 0, startedAt: new Date().toISOString() } });
        if (p.startDelayMs > 0) return void setTimeout(answer, p.startDelayMs);
        return answer();
      }
      // Set going again: the same run, under a new cap.
      const again = /^(?:\/v2)?\/actor-runs\/([^/]+)\/(?:resurrect|reboot|metamorph)$/.exec(path);
      if (req.method === 'POST' && again !== null) {
        const was = [...p.runs.entries()].find(([id]) => id.toLowerCase() === again[1]);
        if (was === undefined) return json(res, 404, { error: { type: 'record-not-found', message: 'Actor run was not found' } });
        startRun(was[1].actor, url, `${was[0]}~${++next}`);
        return json(res, 200, { data: { id: was[0], actId: was[1].actor, status: 'RUNNING', usageTotalUsd: was[1].cost } });
      }
      if (req.method === 'POST' && /\/(?:schedules|webhooks|builds)(?:\/|$)/.test(path)) {
        p.later.push(path);
        return json(res, 201, { data: { id: 'later1' } });
      }
      const sync = /^(?:\/v2)?\/(?:acts|actor-tasks)\/([^/]+)\/run-sync(?:-get-dataset-items)?$/.exec(path);
      if (req.method === 'POST' && sync !== null) {
        p.syncQueries.push(url.search);
        startRun(sync[1] as string, url, `sync${++next}`);
        if (sync[1] === 'missing') return json(res, 404, { error: { type: 'record-not-found', message: 'Actor was not found' } });
        return json(res, 201, [{ url: 'https://example.com/', title: 'Example Domain' }]);
      }
      const asked = /^(?:\/v2)?\/actor-runs\/([^/]+)$/.exec(url.pathname);
      if (req.method === 'GET' && asked !== null) {
        if (p.down) return json(res, 503, { error: { type: 'server-error', message: 'down for maintenance' } });
        if (p.garbage) {
          res.writeHead(200, { 'content-type': 'application/json' });
          return void res.end('{"data": not json');
        }
        const run = p.runs.get(asked[1] as string);
        // A run belongs to the account that started it: another account's token does not find it.
        const foreign = run !== undefined && run.owner !== '' && run.owner !== req.headers.authorization;
        if (foreign) p.foreign++;
        if (run === undefined || foreign) return json(res, 404, { error: { type: 'record-not-found', message: 'Actor run was not found' } });
        run.asked++;
        const ended = run.actor.startsWith('quick') || run.actor.startsWith('fails') || (run.actor.startsWith('slow') && Date.now() - run.started >= p.slowMs);
        const status = !ended ? 'RUNNING' : run.actor.startsWith('fails') ? 'FAILED' : 'SUCCEEDED';
        return json(res, 200, { data: { id: asked[1], actId: run.actor, status, usageTotalUsd: ended ? run.cost : 0.01 } });
      }
      json(res, 404, { error: { type: 'page-not-found', message: 'Page not found' } });
    });
  };
  p.up = await startUpstream(handler);
  return p;
}
