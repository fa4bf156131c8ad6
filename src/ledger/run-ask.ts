// Asking the scraper platform about a run (runs.ts): `GET {base}{path}`
// with the route's master credential, as the configuration in force says
// (a reload's new URL or secret is used from the next question). Bounded:
// a deadline per question and a cap on the answer's size. The credential
// goes in the request header only, and nothing of the exchange is logged
// here; the settler logs the run id and a reason.
import http from 'node:http';
import https from 'node:https';
import { rootCertificates } from 'node:tls';
import { runOf, type RunAnswer } from './runs.ts';

/** Where the route's upstream is and how to authenticate there, now; null when the route is not configured. */
export interface RunTarget {
  readonly target: URL;
  readonly credential: readonly [name: string, value: string];
  readonly upstreamCa: string | null;
}

/** A question's deadline, and the most of an answer read. */
const ASK_MS = 15_000;
const ANSWER_MAX = 1024 * 1024;

export function asker(target: () => RunTarget | null): (path: string) => Promise<RunAnswer> {
  return (path) =>
    new Promise<RunAnswer>((resolve) => {
      const t = target();
      if (t === null) return resolve({ problem: 'the route is not configured' });
      const secure = t.target.protocol === 'https:';
      const get = secure ? https.request : http.request;
      const req = get({
        protocol: t.target.protocol,
        hostname: t.target.hostname,
        port: t.target.port,
        path,
        method: 'GET',
        headers: { [t.credential[0]]: t.credential[1], accept: 'application/json' },
        // Verification always on; a private CA added to the roots, as for forwarded requests.
        ...(secure && t.upstreamCa !== null ? { ca: [...rootCertificates, t.upstreamCa] } : {}),
        timeout: ASK_MS,
      });
      const fail = (problem: string): void => {
        req.destroy();
        resolve({ problem });
      };
      const timer = setTimeout(() => fail('no answer in time'), ASK_MS);
      timer.unref();
      req.on('timeout', () => fail('no answer in time'));
      req.on('error', (err: NodeJS.ErrnoException) => fail(`cannot reach the upstream (${err.code ?? 'error'})`));
      req.on('close', () => clearTimeout(timer));
      req.on('response', (res) => {
        const chunks: Buffer[] = [];
        let size = 0;
        res.on('data', (c: Buffer) => {
          size += c.length;
          if (size > ANSWER_MAX) return fail('an answer too large to be a run');
          chunks.push(c);
        });
        res.on('error', () => fail('the answer broke off'));
        res.on('end', () => {
          clearTimeout(timer);
          if (res.statusCode !== 200) return resolve({ problem: `the upstream answered ${String(res.statusCode)}` });
          let run = null;
          try {
            run = runOf(JSON.parse(Buffer.concat(chunks).toString('utf8')));
          } catch {
            // Not JSON: said below.
          }
          resolve(run === null ? { problem: 'the answer is not a run object' } : { run });
        });
      });
      req.end();
    });
}
