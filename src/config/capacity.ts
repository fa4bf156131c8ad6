// The capacity options (docs/credentials.md, "Capacity"; docs/configuration.md):
// `KEYWARD_<ROUTE>_CONCURRENCY` and `KEYWARD_<ROUTE>_RATE` for every
// credential of a route, `_<n>` for credential n alone, and how long and how
// many requests may wait for room (`KEYWARD_QUEUE_WAIT`, `KEYWARD_QUEUE_MAX`).
// Pure: read from Options, every problem recorded against its option.
import type { Options } from './options.ts';
import { parseRate, QUEUE_WAIT_MAX_MS, type CredentialCapacity, type QueueSettings, type Rate, type RouteCapacity } from '../capacity/plan.ts';

function concurrency(o: Options, name: string): number | null | undefined {
  const text = o.get(name);
  if (text === undefined) return undefined;
  if (/^[1-9]\d{0,5}$/.test(text)) return Number(text);
  o.problem(`${name} must be a whole number from 1 to 999999 (requests in flight per credential)`);
  return null;
}

function rate(o: Options, name: string): Rate | null | undefined {
  const text = o.get(name);
  if (text === undefined) return undefined;
  const r = parseRate(text);
  if (r === null) o.problem(`${name} must be requests per second, minute or hour, a whole number from 1 (e.g. 10/s, 600/m, 5000/h)`);
  return r;
}

/** The option for credential `n` alone: `KEYWARD_SPEECH_CONCURRENCY_2`. */
const oneCredential = (name: string, n: number): string => `${name}_${n}`;

/**
 * Route `route`'s capacity for its `count` credentials (every `_<n>` name is
 * read up to `max`, so a typo'd number is known, and one past the route's
 * credentials is a problem); null when nothing is set.
 */
export function routeCapacity(o: Options, route: string, count: number, max: number): RouteCapacity | null {
  const base = `KEYWARD_${route.toUpperCase()}`;
  const all = { concurrency: concurrency(o, `${base}_CONCURRENCY`), rate: rate(o, `${base}_RATE`) };
  const out: CredentialCapacity[] = [];
  let any = (all.concurrency ?? null) !== null || (all.rate ?? null) !== null;
  for (let n = 1; n <= max; n++) {
    const c = concurrency(o, oneCredential(`${base}_CONCURRENCY`, n));
    const r = rate(o, oneCredential(`${base}_RATE`, n));
    if ((c !== undefined || r !== undefined) && n > count) {
      const names = [c === undefined ? null : oneCredential(`${base}_CONCURRENCY`, n), r === undefined ? null : oneCredential(`${base}_RATE`, n)];
      o.problem(`${names.filter((x) => x !== null).join(', ')}: route ${route} has ${count === 1 ? 'one credential' : `${count} credentials`}`);
      continue;
    }
    if (n > count) continue;
    any ||= (c ?? null) !== null || (r ?? null) !== null;
    out.push({ concurrency: c ?? all.concurrency ?? null, rate: r ?? all.rate ?? null });
  }
  return any && out.length > 0 ? out : null;
}

export function queueSettings(o: Options): QueueSettings {
  const text = o.get('KEYWARD_QUEUE_WAIT');
  let queueWaitMs = 10_000;
  if (text === '0') queueWaitMs = 0;
  else if (text !== undefined) {
    const ms = o.duration('KEYWARD_QUEUE_WAIT', '10s');
    if (ms > QUEUE_WAIT_MAX_MS) o.problem('KEYWARD_QUEUE_WAIT must be a duration from 0 to 5m (e.g. 10s)');
    else if (ms > 0) queueWaitMs = ms;
  }
  const maxText = o.get('KEYWARD_QUEUE_MAX');
  let queueMax = 1000;
  if (maxText !== undefined) {
    if (/^[1-9]\d{0,6}$/.test(maxText)) queueMax = Number(maxText);
    else o.problem('KEYWARD_QUEUE_MAX must be a whole number from 1 to 9999999 (requests waiting per route)');
  }
  return { queueWaitMs, queueMax };
}
