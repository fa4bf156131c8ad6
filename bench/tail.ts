// The tail's causes: what holds keyward's event loop while it serves small
// requests, read from its own metrics before and after the scenario's
// rounds. Each periodic task (a log write, a ledger write, the timer sweep,
// a last-use write) and each kind of garbage collection is a histogram; no
// request moves while one runs, so the longest of them set the latency tail.
import http from 'node:http';

/** One histogram: cumulative counts by upper bound, the sum and the count. */
interface Hist {
  readonly buckets: Map<number, number>;
  sum: number;
  count: number;
}

export type Scrape = Map<string, Hist>;

function get(url: string): Promise<string> {
  return new Promise((resolve, reject) => {
    http
      .get(url, { agent: false }, (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (d: string) => (text += d));
        res.on('end', () => resolve(text));
        res.on('error', reject);
      })
      .on('error', reject);
  });
}

/** The loop-task and garbage-collection histograms of one gateway, by cause (`task log_write`, `gc major`…). */
export async function scrape(admin: string): Promise<Scrape> {
  const text = await get(`${admin}/metrics`);
  const out: Scrape = new Map();
  const line = /^(keyward_loop_task_seconds|nodejs_gc_duration_seconds)_(bucket|sum|count)\{([^}]*)\} (\S+)$/;
  for (const l of text.split('\n')) {
    const m = line.exec(l);
    if (m === null) continue;
    const labels = Object.fromEntries([...(m[3] as string).matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    const cause = m[1] === 'keyward_loop_task_seconds' ? `task ${labels.task}` : `gc ${labels.kind}`;
    let h = out.get(cause);
    if (h === undefined) out.set(cause, (h = { buckets: new Map(), sum: 0, count: 0 }));
    const value = Number(m[4]);
    if (m[2] === 'bucket' && labels.le !== '+Inf') h.buckets.set(Number(labels.le), value);
    else if (m[2] === 'sum') h.sum = value;
    else if (m[2] === 'count') h.count = value;
  }
  return out;
}

export interface Cause {
  readonly cause: string;
  readonly runs: number;
  readonly totalMs: number;
  /** The upper bound of the bucket holding the 99th percentile, and of the highest bucket with a run in it, ms. */
  readonly p99Ms: number;
  readonly maxMs: number;
}

/** What happened between two scrapes, by cause. */
export function between(before: Scrape, after: Scrape): Cause[] {
  const out: Cause[] = [];
  for (const [cause, a] of after) {
    const b = before.get(cause);
    const runs = a.count - (b?.count ?? 0);
    if (runs <= 0) continue;
    const bounds = [...a.buckets.keys()].sort((x, y) => x - y);
    const at = (le: number): number => (a.buckets.get(le) ?? 0) - (b?.buckets.get(le) ?? 0);
    const p99 = bounds.find((le) => at(le) >= runs * 0.99) ?? Infinity;
    let max = Infinity;
    for (const le of bounds) {
      if (at(le) >= runs) {
        max = le;
        break;
      }
    }
    out.push({ cause, runs, totalMs: (a.sum - (b?.sum ?? 0)) * 1000, p99Ms: p99 * 1000, maxMs: max * 1000 });
  }
  return out.sort((x, y) => y.totalMs - x.totalMs);
}
