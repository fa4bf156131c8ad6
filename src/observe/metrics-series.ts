// The series behind metrics.ts: counters and histograms kept in typed
// arrays on the request path, turned into prom-client samples only when
// /metrics is scraped. The only place that knows prom-client's sample shape.
import type { MetricValue } from 'prom-client';

// Up to 300 s: the scraper's synchronous runs wait that long (docs/operations.md).
const BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300] as const;

/** A sample as prom-client's registry reads it (`metricName` names a histogram's _bucket/_sum/_count lines). */
export type Sample = MetricValue<string> & { metricName?: string };

/**
 * How the primary combines workers' values (KEYWARD_WORKERS > 1): counts add
 * up; every worker holds the same key set, so its gauges take the max; the
 * store is up only if it is up for all, and "last reload" is the oldest.
 */
export type Aggregator = 'sum' | 'max' | 'min';

export interface ScrapedMetric {
  readonly name: string;
  readonly help: string;
  readonly type: 'counter' | 'gauge' | 'histogram';
  readonly aggregator: Aggregator;
  get(): { name: string; help: string; type: string; aggregator: Aggregator; values: Sample[] };
}

export function scraped(name: string, help: string, type: ScrapedMetric['type'], values: () => Sample[], aggregator: Aggregator = 'sum'): ScrapedMetric {
  return {
    name,
    help,
    type,
    aggregator,
    get: () => ({ name, help, type, aggregator, values: values() }),
  };
}

/** For work the event loop does between requests (a log write, a ledger write): 50 µs to 1 s. */
export const TASK_BUCKETS: readonly number[] = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1];

export class Histogram {
  readonly counts: Float64Array;
  readonly sums: Float64Array;
  readonly totals: Float64Array;
  readonly #buckets: readonly number[];
  constructor(series: number, buckets: readonly number[] = BUCKETS) {
    this.#buckets = buckets;
    this.counts = new Float64Array(series * buckets.length);
    this.sums = new Float64Array(series);
    this.totals = new Float64Array(series);
  }

  observe(series: number, seconds: number): void {
    const buckets = this.#buckets;
    this.sums[series] = (this.sums[series] as number) + seconds;
    this.totals[series] = (this.totals[series] as number) + 1;
    let b = 0;
    while (b < buckets.length && seconds > (buckets[b] as number)) b++;
    if (b < buckets.length) this.counts[series * buckets.length + b] = (this.counts[series * buckets.length + b] as number) + 1;
  }

  samples(name: string, label: (series: number) => Record<string, string>): Sample[] {
    const buckets = this.#buckets;
    const out: Sample[] = [];
    for (let s = 0; s < this.sums.length; s++) {
      if (this.totals[s] === 0) continue;
      const labels = label(s);
      let cumulative = 0;
      for (let b = 0; b < buckets.length; b++) {
        cumulative += this.counts[s * buckets.length + b] as number;
        out.push({ metricName: `${name}_bucket`, labels: { ...labels, le: String(buckets[b]) }, value: cumulative });
      }
      out.push({ metricName: `${name}_bucket`, labels: { ...labels, le: '+Inf' }, value: this.totals[s] as number });
      out.push({ metricName: `${name}_sum`, labels, value: this.sums[s] as number });
      out.push({ metricName: `${name}_count`, labels, value: this.totals[s] as number });
    }
    return out;
  }
}
