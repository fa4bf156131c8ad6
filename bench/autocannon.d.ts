// The part of autocannon's programmatic API the benchmarks use.
declare module 'autocannon' {
  interface Histogram {
    average: number;
    total: number;
    p50: number;
    p99: number;
  }
  interface Result {
    duration: number;
    errors: number;
    timeouts: number;
    non2xx: number;
    '2xx': number;
    requests: Histogram;
    latency: Histogram;
    throughput: Histogram;
  }
  interface Options {
    url: string;
    method?: string;
    headers?: Record<string, string>;
    body?: string | Buffer;
    connections?: number;
    duration?: number;
    pipelining?: number;
  }
  /** The running load: a promise of its result, and an emitter of each response (with its latency in milliseconds, a float). */
  interface Instance extends PromiseLike<Result> {
    on(event: 'response', listener: (client: unknown, status: number, bytes: number, ms: number) => void): Instance;
  }
  function autocannon(options: Options): Instance;
  export default autocannon;
}
