// The limit flags of `keys create` and `keys update` (docs/limits.md), and
// how a key's limits are written in a line; their checks are keys/changes.ts's.
import type { ParseArgsOptionsConfig } from 'node:util';
import type { Left } from './left.ts';
import type { Limits } from '../keys/limits.ts';

export const LIMIT_OPTIONS = {
  rate: { type: 'string' },
  burst: { type: 'string' },
  concurrency: { type: 'string' },
  quota: { type: 'string' },
  budget: { type: 'string', multiple: true },
  'alert-at': { type: 'string' },
  'run-cap': { type: 'string' },
  'allow-from': { type: 'string' },
} as const satisfies ParseArgsOptionsConfig;

/** One line for `keys list` and the create/update messages: `rate 10/s burst 20, quota 1000/day (988 left), budget seo 5/day`. */
export function describeLimits(limits: Limits | undefined, left: Left | null = null): string {
  if (limits === undefined) return 'none';
  const parts: string[] = [];
  if (limits.rate !== undefined) parts.push(`rate ${limits.rate}${limits.burst !== undefined ? ` burst ${limits.burst}` : ''}`);
  if (limits.concurrency !== undefined) parts.push(`concurrency ${limits.concurrency}`);
  if (limits.quota !== undefined) parts.push(`quota ${limits.quota}${left?.quota !== undefined ? ` (${left.quota} left)` : ''}`);
  for (const [route, b] of Object.entries(limits.budgets ?? {}))
    parts.push(`budget ${route} ${b}${left?.budgets?.[route] !== undefined ? ` (${left.budgets[route]} left)` : ''}`);
  if (limits.runCap !== undefined) parts.push(`run cap ${limits.runCap} usd`);
  if (limits.alerts !== undefined) parts.push(limits.alerts.length === 0 ? 'no alerts' : `alerts at ${limits.alerts.map((a) => `${a}%`).join(',')}`);
  if (limits.allowFrom !== undefined) parts.push(`from ${limits.allowFrom.join(',')}`);
  return parts.join(', ');
}
