// What admission and accounting cost one request, measured directly: CPU
// time of N admissions of the bench's key with every limit (none reached),
// each settled and counted in the ledger as a completed request would be,
// against the same N counted for a key without limits. A gateway's bench
// figure for this difference is a few microseconds inside a spread of tens;
// this one is repeatable to a tenth of a microsecond.
//   node --import tsx bench/admission.ts [N] [--route seo] [--src DIR]   (DIR: another checkout's src, to compare builds)
import { parseArgs } from 'node:util';
import { pathToFileURL } from 'node:url';
import { join, resolve } from 'node:path';

const { values, positionals } = parseArgs({ options: { src: { type: 'string' }, route: { type: 'string' } }, allowPositionals: true });
// scraper: every limit but a budget (a run's cost is settled later: bench/run.ts measures that end to end); seo: the budget too.
const route = values.route ?? 'scraper';
const n = Number(positionals[0] ?? 1_000_000);
const src = resolve(values.src ?? new URL('../src', import.meta.url).pathname);
const load = async <T>(path: string): Promise<T> => (await import(pathToFileURL(join(src, path)).href)) as T;

interface AnyAdmission {
  done?: (reached: boolean, cost: number) => void;
  release?: () => void;
}
const { Limiter } = await load<{
  Limiter: new (use: unknown) => { admit(k: string, p: unknown, r: string, now: number, share?: number): AnyAdmission | Promise<unknown> };
}>('limits/limiter.ts');
const { policyOf } = await load<{ policyOf: (l: unknown) => unknown }>('limits/policy.ts');
const { Ledger } = await load<{
  Ledger: new (
    store: unknown,
    onError: () => void,
  ) => { record(k: string, r: string, s: number, i: number, o: number, c: number): void; requests(): number; cost(): number };
}>('ledger/ledger.ts');
const { MemoryUsageStore } = await load<{ MemoryUsageStore: new () => unknown }>('ledger/memory-store.ts');

const EVERY_LIMIT = {
  rate: '100000000/s',
  burst: 100_000_000,
  concurrency: 1_000_000,
  quota: '1000000000/month',
  budgets: { seo: '1000000000/month', speech: '100000000000/month' },
};
const policy = policyOf(EVERY_LIMIT);

function run(limited: boolean): number {
  const ledger = new Ledger(new MemoryUsageStore(), () => undefined);
  const limiter = new Limiter(ledger);
  const before = process.cpuUsage();
  for (let i = 0; i < n; i++) {
    const now = Date.now();
    const a = limited ? (limiter.admit('key_bench', policy, route, now) as AnyAdmission) : null;
    ledger.record('key_bench', route, 200, 2, 1000, 0.01);
    if (a !== null) {
      a.done?.(true, 0.01);
      a.release?.();
    }
  }
  const used = process.cpuUsage(before);
  return ((used.user + used.system) / n) * 1000; // ns per request
}

// Warm-up, then interleaved rounds; the median difference.
run(true);
run(false);
const diffs: number[] = [];
for (let round = 0; round < 7; round++) diffs.push(run(true) - run(false));
diffs.sort((a, b) => a - b);
const median = diffs[Math.floor(diffs.length / 2)] as number;
process.stdout.write(`${JSON.stringify({ src, route, n, limitedMinusNoneNs: Math.round(median), rounds: diffs.map((d) => Math.round(d)) })}\n`);
