// The settler of scraper runs (ledger/runs.ts) put together for the process
// that decides limits: a gateway alone, the primary of workers, each gateway
// of a fleet. A settled run moves the ledger's period totals, teaches the
// limiter what a run costs, and may cross an alert threshold.
import type { Config } from '../config/load.ts';
import type { Logger } from '../observe/log.ts';
import { runCounters, type Registry } from '../observe/metrics.ts';
import type { Ledger } from '../ledger/ledger.ts';
import type { Limiter } from '../limits/limiter.ts';
import type { Policy } from '../limits/policy.ts';
import { asker, type RunTarget } from '../ledger/run-ask.ts';
import { Settler, type SettlerOptions } from '../ledger/runs.ts';
import type { Spend } from '../alerts/spend.ts';
import type { UsageStore } from '../ledger/store.ts';
import type { Watch } from '../observe/outages.ts';

/** Routes whose cost is settled after the fact (the provider table's `runs`): a paid start there reserves its cap. */
export function billedLaterRoutes(config: Pick<Config, 'routes'>): ReadonlySet<string> {
  return new Set(config.routes.flatMap((r) => (r.cost?.runs === undefined ? [] : [r.name])));
}

export interface SettlerParts {
  readonly config: Pick<Config, 'routes'>;
  readonly store: UsageStore;
  readonly ledger: Ledger;
  readonly limiter: Limiter;
  readonly spend: Spend | null;
  readonly logger: Logger;
  readonly registry: Registry;
  /** Where a route's upstream is now, with the credential (by label) that started the run; null when not configured. */
  readonly target: (route: string, credential: number) => RunTarget | null;
  /** A key and its policy by id, for the alerts a settled run may fire; null when not known here. */
  readonly keyOf: (keyId: string) => { readonly key: { readonly id: string; readonly name: string }; readonly policy: Policy } | null;
  readonly settle?: Pick<SettlerOptions, 'everyMs' | 'backoff' | 'giveUpMs'>;
  /** Where a failing round is seen (observe/outages.ts). */
  readonly watch?: Watch;
}

/** Started, or null when no route settles runs or the store keeps none (memory). */
export function runSettler(p: SettlerParts): Settler | null {
  const runs = p.store.runs;
  const routes = billedLaterRoutes(p.config);
  if (runs === undefined || routes.size === 0) return null;
  const counters = runCounters(p.registry);
  const askers = new Map<string, ReturnType<typeof asker>>();
  const settler = new Settler({
    ...p.settle,
    store: runs,
    gateway: p.ledger.id,
    ...(p.watch === undefined ? {} : { watch: p.watch }),
    ask: (run) => {
      // A run belongs to the account that started it: asked with that credential (docs/credentials.md).
      const credential = run.credential ?? 1;
      const which = `${run.route}\0${credential}`;
      let a = askers.get(which);
      if (a === undefined) askers.set(which, (a = asker(() => p.target(run.route, credential))));
      return a(run.path);
    },
    max: Math.max(0, ...p.config.routes.map((r) => (r.cost?.runs === undefined ? 0 : r.cost.max))),
    settled: (run, cost) => {
      counters.settled.inc();
      p.ledger.adjust(run.keyId, run.route, run.day, cost - run.booked);
      p.logger.info({ run: run.id, keyId: run.keyId, route: run.route, day: run.day, cost, booked: run.booked }, 'scraper run settled');
      // A settled run can cross an alert threshold.
      const known = p.keyOf(run.keyId);
      if (known !== null && known.policy.alerts.length > 0) p.spend?.counted(known.key, known.policy);
    },
    failed: (run, problem) => {
      // The reason without its detail in parentheses: a bounded set of labels.
      counters.failed.inc({ reason: problem.replace(/ \(.*\)$/, '') });
      p.logger.debug({ run: run.id, route: run.route, attempts: run.attempts + 1, problem }, 'scraper run not settled yet');
    },
    gaveUp: (run) => {
      counters.gaveUp.inc();
      p.logger.warn(
        { run: run.id, keyId: run.keyId, route: run.route, day: run.day, booked: run.booked },
        'scraper run given up unsettled at the give-up age; its reservation stays booked as its cost',
      );
    },
  });
  settler.start();
  return settler;
}
