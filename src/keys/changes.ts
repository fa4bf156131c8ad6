// The checks of a key's values that the CLI (`keys create`, `keys update`)
// and the admin API (`POST /v1/keys`, `PATCH /v1/keys/{id}`) share, written
// once (docs/keys.md, docs/limits.md): names, routes, expiry and limits
// checked before any store is opened, and turned into a new key's options or
// a change of one. Both spell values the same way (the CLI's flags, the
// API's body fields); a value refused is a UsageError, which the CLI prints
// with its help and the API answers 400. Pure.
import { parseDuration } from '../lib/units.ts';
import { UsageError } from '../lib/io.ts';
import { ALLOW_FROM_MAX, allowFromProblem, limitsProblem, type Limits } from './limits.ts';
import { KeyUsageError, type KeyChanges, type KeyOptions } from './manage.ts';

/** Per field: a new value, or null to remove it (`none`); budgets by route. Absent: unchanged. */
export interface LimitChanges {
  readonly rate?: string | null;
  readonly burst?: number | null;
  readonly concurrency?: number | null;
  readonly quota?: string | null;
  readonly budgets?: Readonly<Record<string, string | null>>;
  /** Alert thresholds in percent; empty: none (`--alert-at none`). */
  readonly alerts?: readonly number[] | null;
  /** The most one scraper run may be capped at, US dollars. */
  readonly runCap?: number | null;
  /** Client address ranges the key may be used from (docs/keys.md, "Allowed addresses"). */
  readonly allowFrom?: readonly string[] | null;
}

const whole = (name: string, text: string, fail: (message: string) => void): number => {
  if (!/^[1-9]\d{0,8}$/.test(text)) fail(`--${name} must be a whole number above 0, or none`);
  return Number(text);
};

/** The limit flags of a parsed command; `allowNone` on update, where `none` removes a limit. */
export function limitChanges(values: Record<string, unknown>, costly: readonly string[], help: string, allowNone: boolean): LimitChanges {
  // Every bad flag is reported, not only the first (as the configuration does).
  const problems: string[] = [];
  const fail = (message: string): void => void problems.push(message);
  const text = (name: string): string | null | undefined => {
    const v = values[name];
    if (typeof v !== 'string') return undefined;
    if (v === 'none') {
      if (!allowNone) fail(`--${name} none only removes a limit on keys update`);
      return null;
    }
    return v;
  };
  const changes: { -readonly [K in keyof LimitChanges]: LimitChanges[K] } = {};
  const rate = text('rate');
  if (rate !== undefined) {
    if (rate !== null && limitsProblem({ rate }, costly) !== null) fail('--rate must be N/s, N/m or N/h (e.g. 10/s), or none');
    changes.rate = rate;
  }
  const burst = text('burst');
  if (burst !== undefined) changes.burst = burst === null ? null : whole('burst', burst, fail);
  const concurrency = text('concurrency');
  if (concurrency !== undefined) changes.concurrency = concurrency === null ? null : whole('concurrency', concurrency, fail);
  const quota = text('quota');
  if (quota !== undefined) {
    if (quota !== null && limitsProblem({ quota }, costly) !== null) fail('--quota must be N/day or N/month (e.g. 1000/day), or none');
    changes.quota = quota;
  }
  const runCap = text('run-cap');
  if (runCap !== undefined) {
    if (runCap !== null && (!/^\d{1,9}(?:\.\d{1,6})?$/.test(runCap) || Number(runCap) <= 0))
      fail('--run-cap must be an amount in US dollars above 0, to the micro-dollar (e.g. 0.5), or none');
    changes.runCap = runCap === null ? null : Number(runCap);
  }
  const allowFrom = text('allow-from');
  if (allowFrom !== undefined) {
    const ranges = allowFrom === null ? null : [...new Set(allowFrom.split(',').map((r) => r.trim()))].filter((r) => r !== '');
    if (ranges !== null && allowFromProblem(ranges) !== null)
      fail(
        `--allow-from must be 1 to ${ALLOW_FROM_MAX} address ranges, comma-separated (10.0.0.0/8,2001:db8::/32, or single addresses; no zone id, no IPv6 range that takes in every IPv4 address such as ::/8), or none`,
      );
    changes.allowFrom = ranges;
  }
  const alertAt = values['alert-at'];
  if (typeof alertAt === 'string') {
    // `none` turns a key's alerts off, on create as on update; `default` (the API's null) goes back to
    // the defaults (80 % and 100 %), as absent means.
    const list = alertAt === 'none' || alertAt === 'default' ? [] : alertAt.split(',').map((p) => /^\s*([1-9]\d?|100)\s*%?\s*$/.exec(p)?.[1] ?? null);
    if (list.some((p) => p === null) || list.length > 10) fail('--alert-at must be up to 10 percentages from 1 to 100 (e.g. 80%,100%), none or default');
    else changes.alerts = alertAt === 'default' ? null : [...new Set(list.map(Number))].sort((a, b) => a - b);
  }
  const budgets = values.budget;
  if (Array.isArray(budgets)) {
    const byRoute: Record<string, string | null> = {};
    for (const b of budgets) {
      if (typeof b !== 'string') continue;
      const m = /^([a-z0-9-]+)=(.+)$/.exec(b);
      if (m === null) {
        fail('--budget must be ROUTE=AMOUNT/day or ROUTE=AMOUNT/month (e.g. seo=5/day)');
        continue;
      }
      const [, route = '', amount = ''] = m;
      if (!costly.includes(route)) {
        fail(`--budget: ${route} is no route that reports a cost; budgets apply to ${costly.join(', ')}`);
        continue;
      }
      if (amount === 'none') {
        if (!allowNone) fail('--budget ROUTE=none only removes a budget on keys update');
        byRoute[route] = null;
      } else if (limitsProblem({ budgets: { [route]: amount } }, costly) !== null) {
        fail('--budget must be ROUTE=AMOUNT/day or ROUTE=AMOUNT/month (e.g. seo=5/day)');
      } else byRoute[route] = amount;
    }
    changes.budgets = byRoute;
  }
  if (problems.length > 0) throw new UsageError(problems.join('; '), help);
  return changes;
}

/** Why `limits` cannot hold a run cap (it has no budget on a route whose runs are settled), or null. */
export function runCapProblem(limits: Limits | undefined, runRoutes: readonly string[]): string | null {
  if (limits?.runCap === undefined || runRoutes.some((r) => limits.budgets?.[r] !== undefined)) return null;
  return `--run-cap needs a budget on ${runRoutes.join(' or ')} (give --budget ${runRoutes[0] ?? 'scraper'}=AMOUNT/day too)`;
}

/** `limits` with `changes` applied; undefined when nothing is left. */
export function applyLimits(limits: Limits | undefined, changes: LimitChanges): Limits | undefined {
  const next: Record<string, unknown> = { ...limits };
  for (const field of ['rate', 'burst', 'concurrency', 'quota', 'runCap', 'allowFrom'] as const) {
    const v = changes[field];
    if (v === null) delete next[field];
    else if (v !== undefined) next[field] = v;
  }
  if (changes.alerts === null) delete next.alerts;
  else if (changes.alerts !== undefined) next.alerts = changes.alerts;
  // A burst belongs to its rate.
  if (next.rate === undefined) delete next.burst;
  if (changes.budgets !== undefined) {
    const budgets: Record<string, string> = { ...limits?.budgets };
    for (const [route, v] of Object.entries(changes.budgets)) {
      if (v === null) delete budgets[route];
      else budgets[route] = v;
    }
    if (Object.keys(budgets).length === 0) delete next.budgets;
    else next.budgets = budgets;
  }
  return Object.keys(next).length === 0 ? undefined : next;
}

export function routesOption(text: string, known: readonly string[], help: string, allowAll: boolean): string[] | null {
  if (allowAll && text === 'all') return null;
  const names = text.split(',').map((n) => n.trim());
  for (const n of names) {
    if (!known.includes(n))
      throw new UsageError(`--routes: unknown route ${JSON.stringify(n)} (routes: ${known.join(', ')}${allowAll ? ', or all' : ''})`, help);
  }
  return [...new Set(names)];
}

export function durationOption(name: string, text: string, help: string, allowZero = false): number {
  const ms = parseDuration(text);
  if (ms === null || ms < 0 || (ms === 0 && !allowZero)) throw new UsageError(`--${name} must be a duration such as 12h, 30d or 90m`, help);
  return ms;
}

/** What a key's values are checked against: the routes of this gateway's provider table. */
export interface KeyRules {
  /** The routes a key may name. */
  readonly names: readonly string[];
  /** The routes whose cost a budget may cap. */
  readonly costly: readonly string[];
  /** Routes whose runs are settled after the fact: where a run cap applies. */
  readonly runRoutes: readonly string[];
}

/**
 * A new key's name and options from the values of `keys create` (as
 * parseArgs gives them; the admin API spells its body the same way), every
 * value checked: the one check of a new key, from the CLI or over HTTP.
 */
export function newKeyOptions(values: Record<string, unknown>, rules: KeyRules, help: string): { name: string; options: KeyOptions } {
  if (typeof values.name !== 'string') throw new UsageError('keys create needs --name NAME', help);
  const expiresInMs = typeof values['expires-in'] === 'string' ? durationOption('expires-in', values['expires-in'], help) : null;
  const routes = typeof values.routes === 'string' ? routesOption(values.routes, rules.names, help, false) : null;
  const limits = applyLimits(undefined, limitChanges(values, rules.costly, help, false));
  if (values.burst !== undefined && limits?.rate === undefined) throw new UsageError('--burst needs --rate', help);
  const noCap = runCapProblem(limits, rules.runRoutes);
  if (noCap !== null) throw new UsageError(noCap, help);
  return {
    name: values.name,
    options: {
      expiresInMs,
      routes,
      ...(limits === undefined ? {} : { limits }),
      ...(typeof values['external-id'] === 'string' ? { externalId: values['external-id'] } : {}),
    },
  };
}

/** The changes of `keys update` (or `PATCH /v1/keys/{id}`), every value checked; a UsageError when there are none. */
export function keyChangesOf(values: Record<string, unknown>, rules: KeyRules, help: string): KeyChanges {
  const changes: { -readonly [K in keyof KeyChanges]: KeyChanges[K] } = {};
  if (typeof values.routes === 'string') changes.routes = routesOption(values.routes, rules.names, help, true);
  if (typeof values['expires-in'] === 'string')
    changes.expiresInMs = values['expires-in'] === 'never' ? null : durationOption('expires-in', values['expires-in'], help);
  if (typeof values['external-id'] === 'string') changes.externalId = values['external-id'] === 'none' ? null : values['external-id'];
  const limitEdits = limitChanges(values, rules.costly, help, true);
  if (Object.keys(limitEdits).length > 0) {
    changes.limits = (current) => {
      const next = applyLimits(current, limitEdits);
      if (limitEdits.burst !== undefined && limitEdits.burst !== null && next?.rate === undefined)
        throw new KeyUsageError('--burst needs a rate (give --rate too)');
      const noCap = runCapProblem(next, rules.runRoutes);
      if (noCap !== null) throw new KeyUsageError(noCap);
      return next;
    };
  }
  if (Object.keys(changes).length === 0)
    throw new UsageError(
      'keys update needs --routes, --expires-in or --external-id, or a limit (--rate, --burst, --concurrency, --quota, --budget, --run-cap, --alert-at, --allow-from)',
      help,
    );
  return changes;
}
