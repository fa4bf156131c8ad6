// What is measured, and how each scenario first proves it gets the right answer.
import autocannon from 'autocannon';
import http from 'node:http';
import { cpuUs, rssPeak, tree } from './proc.ts';
import type { Route, System } from './systems.ts';

export interface Measurement {
  requests: number;
  errors: number;
  rps: number | null;
  p50Ms: number | null;
  p99Ms: number | null;
  /** The 99.9th percentile: the tail a busy client meets once a second. */
  p999Ms: number | null;
  /** CPU of the system's process tree per request, µs (null for direct). */
  cpuUsPerReq: number | null;
  mbps: number | null;
  peakRssMb: number | null;
}

export interface Options {
  readonly durationS: number;
  readonly latencyRequests: number;
  readonly slowStreams: number;
  readonly uploads: number;
}

export interface Scenario {
  readonly name: string;
  readonly title: string;
  /** Run each round on freshly started processes (memory figures free of earlier scenarios). */
  readonly fresh?: boolean;
  validate(sys: System): Promise<void>;
  run(sys: System, o: Options): Promise<Measurement>;
}

const MiB = 1024 * 1024;
const UPLOAD = Buffer.alloc(50 * MiB, 7);

interface Answer {
  status: number;
  body: Buffer;
}

function call(sys: System, route: Route, method: string, path: string, body?: Buffer, agent: http.Agent | false = false): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const headers: http.OutgoingHttpHeaders = { ...sys.headers(route) };
    if (body !== undefined) headers['content-length'] = body.length;
    const req = http.request(`${sys.base}${sys.prefix(route)}${path}`, { method, headers, agent }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode as number, body: Buffer.concat(chunks) }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.setTimeout(60_000, () => req.destroy(new Error('timeout')));
    req.end(body);
  });
}

function expect(sys: System, what: string, ok: boolean, detail: string): void {
  if (!ok) throw new Error(`validation failed for ${sys.name}, ${what}: ${detail}`);
}

function empty(): Measurement {
  return { requests: 0, errors: 0, rps: null, p50Ms: null, p99Ms: null, p999Ms: null, cpuUsPerReq: null, mbps: null, peakRssMb: null };
}

/** Going direct has no process of its own (the only process is the upstream stand-in every system shares). */
const mb = (sys: System, peak: number): number | null => (sys.name === 'direct' ? null : peak / MiB);

/** Process-tree CPU and peak RSS around `work`. */
async function metered<T>(sys: System, work: () => PromiseLike<T>): Promise<{ result: T; cpu: number; peak: number }> {
  const pids = sys.pid === null ? [] : tree(sys.pid);
  const before = cpuUs(pids);
  const stop = rssPeak(pids);
  const result = await work();
  const peak = stop();
  return { result, cpu: cpuUs(pids) - before, peak };
}

const quantile = (sorted: number[], q: number): number => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? NaN;

/**
 * autocannon at `connections`, each request's latency taken from its own
 * timer (a float in milliseconds: autocannon's histogram keeps whole
 * milliseconds only, too coarse for a tail of a few).
 */
function cannon(route: Route, method: 'GET' | 'POST', path: string, connections: number, body?: string): (sys: System, o: Options) => Promise<Measurement> {
  return async (sys, o) => {
    const samples: number[] = [];
    const { result, cpu, peak } = await metered(sys, () => {
      const instance = autocannon({
        url: `${sys.base}${sys.prefix(route)}${path}`,
        method,
        headers: { ...sys.headers(route), ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
        body,
        connections,
        duration: o.durationS,
      });
      instance.on('response', (_client: unknown, status: number, _bytes: number, ms: number) => {
        if (status >= 200 && status < 300) samples.push(ms);
      });
      return instance;
    });
    const errors = result.errors + result.timeouts + result.non2xx;
    const requests = result['2xx'];
    samples.sort((a, b) => a - b);
    return {
      requests,
      errors,
      rps: requests / result.duration,
      p50Ms: quantile(samples, 0.5),
      p99Ms: quantile(samples, 0.99),
      p999Ms: quantile(samples, 0.999),
      cpuUsPerReq: sys.name === 'direct' || requests === 0 ? null : cpu / requests,
      mbps: result.throughput.total / result.duration / 1e6,
      peakRssMb: mb(sys, peak),
    };
  };
}

/**
 * 10 MiB bodies on 8 connections, by plain Node clients that discard the
 * bytes (autocannon parses bodies in JavaScript and tops out far below
 * loopback speed): measures the systems, not the load generator.
 */
function streamed(route: Route, method: 'GET' | 'POST', path: string): (sys: System, o: Options) => Promise<Measurement> {
  return async (sys, o) => {
    const agent = new http.Agent({ keepAlive: true, maxSockets: 8 });
    let bytes = 0;
    let requests = 0;
    let errors = 0;
    const until = Date.now() + o.durationS * 1000;
    const started = process.hrtime.bigint();
    const fetchOne = (): Promise<void> =>
      new Promise((resolve) => {
        const req = http.request(`${sys.base}${sys.prefix(route)}${path}`, { method, headers: sys.headers(route), agent }, (res) => {
          let got = 0;
          res.on('data', (c: Buffer) => (got += c.length));
          res.on('end', () => {
            if (res.statusCode === 200 && got === 10 * MiB) requests++;
            else errors++;
            bytes += got;
            resolve();
          });
          res.on('error', () => (errors++, resolve()));
        });
        req.on('error', () => (errors++, resolve()));
        req.end();
      });
    const { cpu, peak } = await metered(sys, () =>
      Promise.all(
        Array.from({ length: 8 }, async () => {
          while (Date.now() < until) await fetchOne();
        }),
      ),
    );
    agent.destroy();
    const seconds = Number(process.hrtime.bigint() - started) / 1e9;
    return {
      ...empty(),
      requests,
      errors,
      rps: requests / seconds,
      mbps: bytes / seconds / 1e6,
      cpuUsPerReq: sys.name === 'direct' || requests === 0 ? null : cpu / requests,
      peakRssMb: mb(sys, peak),
    };
  };
}

export const SCENARIOS: readonly Scenario[] = [
  {
    name: 'small',
    title: 'small: POST /scraper/v2/acts/x/runs, ~1 KB JSON answer, 64 connections',
    validate: async (sys) => {
      const a = await call(sys, 'scraper', 'POST', '/v2/acts/x/runs', Buffer.from('{}'));
      expect(sys, 'small', a.status === 201 && a.body.length > 900 && a.body.includes('"READY"'), `status ${a.status}, ${a.body.length} bytes`);
    },
    run: cannon('scraper', 'POST', '/v2/acts/x/runs', 64, '{}'),
  },
  {
    name: 'read',
    title: 'read: GET /seo/v3/appendix/user_data, 64 connections',
    validate: async (sys) => {
      const a = await call(sys, 'seo', 'GET', '/v3/appendix/user_data');
      expect(sys, 'read', a.status === 200 && a.body.includes('"status_code":20000'), `status ${a.status}`);
    },
    run: cannon('seo', 'GET', '/v3/appendix/user_data', 64),
  },
  {
    name: 'stream',
    title: 'stream: GET /speech/v1/history/x/audio, 10 MiB binary, 8 connections',
    validate: async (sys) => {
      const a = await call(sys, 'speech', 'GET', '/v1/history/x/audio');
      expect(sys, 'stream', a.status === 200 && a.body.length === 10 * MiB, `status ${a.status}, ${a.body.length} bytes`);
    },
    run: streamed('speech', 'GET', '/v1/history/x/audio'),
  },
  {
    name: 'json',
    title: 'json: POST /scraper/v2/acts/x/run-sync-get-dataset-items, 10 MiB JSON dataset, 8 connections',
    validate: async (sys) => {
      const a = await call(sys, 'scraper', 'POST', '/v2/acts/x/run-sync-get-dataset-items', Buffer.from('{}'));
      let items = 0;
      try {
        items = (JSON.parse(a.body.toString()) as unknown[]).length;
      } catch {
        items = -1;
      }
      expect(sys, 'json', a.status === 200 && a.body.length === 10 * MiB && items > 1000, `status ${a.status}, ${a.body.length} bytes, ${items} items`);
    },
    run: streamed('scraper', 'POST', '/v2/acts/x/run-sync-get-dataset-items'),
  },
  {
    name: 'latency',
    title: 'latency: GET /seo/v3/appendix/user_data, one keep-alive connection, sequential',
    validate: async () => undefined, // same request as `read`
    run: async (sys, o) => {
      const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
      const samples: number[] = [];
      let errors = 0;
      const { cpu } = await metered(sys, async () => {
        for (let i = 0; i < o.latencyRequests; i++) {
          const t = process.hrtime.bigint();
          const a = await call(sys, 'seo', 'GET', '/v3/appendix/user_data', undefined, agent);
          if (a.status !== 200) errors++;
          samples.push(Number(process.hrtime.bigint() - t) / 1e6);
        }
      });
      agent.destroy();
      samples.sort((x, y) => x - y);
      return {
        ...empty(),
        requests: samples.length,
        errors,
        p50Ms: quantile(samples, 0.5),
        p99Ms: quantile(samples, 0.99),
        cpuUsPerReq: sys.name === 'direct' ? null : cpu / samples.length,
      };
    },
  },
  {
    name: 'slow',
    title: 'many slow streams: 1,000 concurrent GETs, each 64 KiB over the stream time, fresh processes',
    fresh: true,
    validate: async (sys) => {
      const a = await call(sys, 'speech', 'GET', '/v1/text-to-speech/slow');
      expect(sys, 'slow', a.status === 200 && a.body.length === 65_536, `status ${a.status}, ${a.body.length} bytes`);
    },
    run: async (sys, o) => {
      let errors = 0;
      const started = Date.now();
      const { cpu, peak } = await metered(sys, () =>
        Promise.all(
          Array.from({ length: o.slowStreams }, () =>
            call(sys, 'speech', 'GET', '/v1/text-to-speech/slow').then(
              (a) => {
                if (a.status !== 200 || a.body.length !== 65_536) errors++;
              },
              () => errors++,
            ),
          ),
        ),
      );
      const seconds = (Date.now() - started) / 1000;
      return {
        ...empty(),
        requests: o.slowStreams - errors,
        errors,
        mbps: (o.slowStreams * 65_536) / seconds / 1e6,
        cpuUsPerReq: sys.name === 'direct' ? null : cpu / o.slowStreams,
        peakRssMb: mb(sys, peak),
      };
    },
  },
  {
    name: 'upload',
    title: 'upload: POST /speech/v1/speech-to-text, 50 MiB each, one at a time',
    validate: async (sys) => {
      const a = await call(sys, 'speech', 'POST', '/v1/speech-to-text', UPLOAD);
      expect(
        sys,
        'upload',
        a.status === 200 && a.body.toString() === JSON.stringify({ bytes: UPLOAD.length }),
        `status ${a.status}: ${a.body.toString().slice(0, 80)}`,
      );
    },
    run: async (sys, o) => {
      let errors = 0;
      const started = process.hrtime.bigint();
      const { cpu, peak } = await metered(sys, async () => {
        for (let i = 0; i < o.uploads; i++) {
          const a = await call(sys, 'speech', 'POST', '/v1/speech-to-text', UPLOAD);
          if (a.status !== 200) errors++;
        }
      });
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      return {
        ...empty(),
        requests: o.uploads,
        errors,
        mbps: (o.uploads * UPLOAD.length) / seconds / 1e6,
        cpuUsPerReq: sys.name === 'direct' ? null : cpu / o.uploads,
        peakRssMb: mb(sys, peak),
      };
    },
  },
];
