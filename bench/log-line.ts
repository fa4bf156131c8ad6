// The request log line on its own: CPU per line through the gateway's real
// logger (template, batching, SonicBoom, the write to fd 1), against pino's
// generic call for the same fields through the same destination. Run by
// run.ts as a child whose stdout is /dev/null; prints one JSON object on
// stderr. Every 8 lines the loop yields to the event loop, as a busy gateway
// does between completions; the cost of the bare loop is subtracted.
import { createLogger, requestLogger, type RequestFields } from '../src/observe/log.ts';

const LINES = Number(process.argv[2] ?? 200_000);
const f: RequestFields = {
  reqId: '5f3a9c1e-2n9',
  traceId: null,
  client: '127.0.0.1',
  keyId: 'key_5f3a9c1e2b7d',
  keyName: 'bench',
  route: 'scraper',
  method: 'POST',
  path: '/v2/acts/x/runs',
  status: 201,
  bytesIn: 2,
  bytesOut: 1024,
  durationMs: 1.234,
  ttfbMs: 0.987,
  queuedMs: null,
  error: null,
  authFailure: null,
  credential: null,
  refusedBy: null,
  aborted: false,
};

async function cpuPerLine(write: () => void): Promise<number> {
  const before = process.cpuUsage();
  for (let i = 0; i < LINES; i++) {
    write();
    if (i % 8 === 7) await new Promise((r) => setImmediate(r));
  }
  const used = process.cpuUsage(before);
  return (used.user + used.system) / LINES;
}

const log = createLogger('info');
const line = requestLogger(log.logger);
const results: Record<string, number[]> = { loop: [], template: [], pino: [] };
for (let round = 0; round < 4; round++) {
  results.loop?.push(await cpuPerLine(() => undefined));
  results.template?.push(await cpuPerLine(() => line('info', f)));
  results.pino?.push(await cpuPerLine(() => log.logger.info(f, 'request completed')));
}
await log.flush();
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
const loop = median(results.loop ?? []);
process.stderr.write(`${JSON.stringify({ templateUs: median(results.template ?? []) - loop, pinoUs: median(results.pino ?? []) - loop, rounds: results })}\n`);
