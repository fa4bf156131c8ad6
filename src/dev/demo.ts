// `keyward demo`: stand-in upstreams, the gateway in front of them, a demo
// key, and curl commands that work as printed. No upstream account needed.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Io } from '../lib/io.ts';
import { loadConfig } from '../config/load.ts';
import { openKeyStore } from '../keys/open.ts';
import { createKey } from '../keys/manage.ts';
import type { KeyStore } from '../keys/store.ts';
import { createLogger, type LogHandle } from '../observe/log.ts';
import { createGateway, type Gateway } from '../process/server.ts';
import { startAdmin, type Admin } from '../process/admin.ts';
import { providerEnv, type Example, type UpstreamSpec } from '../request/routes.ts';
import { STANDIN_BUSY_RETRY_AFTER, STANDIN_RUN, startStandins } from './standins.ts';
import { numberedEnv } from '../config/upstreams.ts';
import type { Retry } from '../request/credentials.ts';
import { detach } from '../lib/detach.ts';

/** One curl command line for `example` on `route` (what the demo prints and its test runs). */
function curlLine(base: string, route: string, example: Example, auth: string | null): string {
  const flags = example.stream === true ? '-sSN' : '-sS';
  const parts = ['curl', flags];
  if (example.method !== 'GET') parts.push('-X', example.method);
  if (auth !== null) parts.push(auth);
  if (example.body !== undefined) parts.push("-H 'content-type: application/json'", '-d', `'${example.body}'`);
  if (example.output !== undefined) parts.push('-o', example.output);
  parts.push(`${base}/${route}${example.path}`);
  return parts.join(' ');
}

/** The demo budget, in the route's unit: less than one call of its example costs. */
const BUDGET = 10;
/** The demo's scraper budget, USD: two stand-in runs spend it. */
const RUN_BUDGET = 0.5;

/** The route given two credentials, the first of which answers 429 every this many requests (its account busy now and then). */
const BUSY_ROUTE = 'speech';
const BUSY_EVERY = 3;
/** A plain call on that route its stand-in answers (the voices list). */
const BUSY_CALL = '/v1/voices';
/** What each of its accounts takes at once (docs/credentials.md, "Capacity"): a burst of streams waits its turn. */
const BUSY_CONCURRENCY = 2;
const BURST = 6;

/** A key for the demo, and the example it is shown with. */
interface DemoKey {
  readonly spec: UpstreamSpec;
  readonly example: Example;
  readonly key: { readonly token: string };
}

/** The demo's keys: one without limits, one with a small budget, one with a budget on scraper runs. */
async function demoKeys(store: KeyStore, specs: readonly UpstreamSpec[]): Promise<{ token: string; budgeted: DemoKey | null; runs: DemoKey | null }> {
  const { token } = await createKey(store, 'demo');
  // A second key with a small budget on the first route that reports a cost, so a refusal can be tried.
  const costly = specs.find((spec) => spec.cost !== null && spec.demo.examples.some((e) => e.method === 'POST' && e.output !== undefined && e.stream !== true));
  const budgeted =
    costly === undefined
      ? null
      : {
          spec: costly,
          example: costly.demo.examples.find((e) => e.method === 'POST' && e.output !== undefined && e.stream !== true) as Example,
          key: await createKey(store, 'demo-budget', { limits: { budgets: { [costly.name]: `${BUDGET}/day` } } }),
        };
  // A key with a budget on the scraper's runs, settled once they end (docs/limits.md, "Scraper runs").
  const runSpec = specs.find((spec) => spec.cost?.runs !== undefined && spec.demo.examples.some((e) => e.method === 'POST'));
  const runs =
    runSpec === undefined
      ? null
      : {
          spec: runSpec,
          example: runSpec.demo.examples.find((e) => e.method === 'POST') as Example,
          key: await createKey(store, 'demo-runs', { limits: { budgets: { [runSpec.name]: `${RUN_BUDGET}/day` }, runCap: RUN_BUDGET } }),
        };
  return { token, budgeted, runs };
}

/** Where the demo keeps its keys and serves its admin listener, for the lines to paste. */
interface DemoPlaces {
  readonly keysFile: string;
  /** The admin listener's base URL; null when KEYWARD_ADMIN_PORT=off. */
  readonly admin: string | null;
  /** The route with two credentials; null when the providers have none by BUSY_ROUTE's name. */
  readonly busy: UpstreamSpec | null;
}

/** The line the demo prints when the gateway sent a request again on another credential. */
export function retryLine(r: Retry): string {
  return `retried: ${r.route.name} answered ${r.status} on credential ${r.from}, sent again on credential ${r.to} (credential ${r.from} set aside for its Retry-After)`;
}

/** The demo's lines for the route with two credentials: what happens, and a loop of plain calls that shows it. */
function busyText(base: string, auth: string, busy: UpstreamSpec | null): string[] {
  if (busy === null) return [];
  return [
    `# ${busy.name} has two credentials (two accounts); the stand-in answers 429 to one in ${BUSY_EVERY} requests made with credential 1 (Retry-After: ${STANDIN_BUSY_RETRY_AFTER}).`,
    `# keyward sets credential 1 aside and sends the request again on credential 2: every call gets 200, a "retried: …" line is printed here,`,
    `# and the request's log line on stderr says "credential":2,"refusedBy":"1:429"`,
    `for i in 1 2 3 4 5 6; do curl -sS -o /dev/null -w '%{http_code}\\n' ${auth} ${base}/${busy.name}${BUSY_CALL}; done`,
    '',
    ...burstText(base, auth, busy),
  ];
}

/** A burst of streams past what the accounts take at once: it waits its turn instead of failing. */
function burstText(base: string, auth: string, busy: UpstreamSpec): string[] {
  const stream = busy.demo.examples.find((e) => e.stream === true && e.method === 'POST');
  if (stream === undefined) return [];
  const body = stream.body === undefined ? '' : ` -H 'content-type: application/json' -d ${shellQuote(stream.body)}`;
  return [
    `# each ${busy.name} account takes ${BUSY_CONCURRENCY} requests at once (KEYWARD_${busy.name.toUpperCase()}_CONCURRENCY=${BUSY_CONCURRENCY}); a burst of ${BURST} two-second streams`,
    `# waits its turn in keyward's queue instead of meeting the provider's 429: ${BURST} times 200, and the log lines of those that waited say "queuedMs"`,
    `for i in $(seq ${BURST}); do curl -sS -o /dev/null -w '%{http_code}\\n' -X POST ${auth}${body} ${base}/${busy.name}${stream.path} & done; wait`,
    '',
  ];
}

/** A value quoted for a POSIX shell, whatever it holds. */
const shellQuote = (v: string): string => `'${v.replace(/'/g, `'\\''`)}'`;

/** What the demo prints: the gateway's address, the token, a curl line per example, and where to try the CLI and the usage page. */
function demoText(
  base: string,
  specs: readonly UpstreamSpec[],
  { token, budgeted, runs }: { token: string; budgeted: DemoKey | null; runs: DemoKey | null },
  places: DemoPlaces,
): string {
  const auth = `-H 'Authorization: Bearer ${token}'`;
  // The refused request: the first plain GET of any provider.
  const plain = specs.flatMap((spec) => spec.demo.examples.filter((e) => e.method === 'GET' && e.body === undefined).map((e) => [spec.name, e] as const))[0];
  return [
    '',
    `keyward demo: gateway on ${base}, stand-in upstreams on 127.0.0.1, demo key "demo".`,
    `Token: ${token}`,
    '',
    ...specs.flatMap((spec) => [`# ${spec.demo.title}`, ...spec.demo.examples.map((e) => curlLine(base, spec.name, e, auth)), '']),
    ...(plain === undefined
      ? []
      : ['# no token: refused by the gateway (401 {"error":"Unauthorized.","code":"unauthorized"})', curlLine(base, plain[0], plain[1], null), '']),
    ...(budgeted === null
      ? []
      : [
          `# key "demo-budget", a budget of ${BUDGET} ${budgeted.spec.cost?.unit ?? ''} a day on ${budgeted.spec.name}: the first call is admitted (and costs more), the next refused (429 budget_exceeded)`,
          curlLine(
            base,
            budgeted.spec.name,
            { ...budgeted.example, output: `budget-${budgeted.example.output ?? 'out'}` },
            `-H 'Authorization: Bearer ${budgeted.key.token}'`,
          ),
          curlLine(base, budgeted.spec.name, { ...budgeted.example, output: undefined }, `-H 'Authorization: Bearer ${budgeted.key.token}'`),
          '',
        ]),
    ...busyText(base, auth, places.busy),
    ...(runs === null
      ? []
      : [
          `# key "demo-runs", a budget of ${RUN_BUDGET} usd a day on ${runs.spec.name} and a run cap of ${RUN_BUDGET}: a run costs ${STANDIN_RUN.usd} usd, booked once it ended (asked a few seconds after);`,
          `# each start is capped (maxTotalChargeUsd) at the run cap or what is left, and reserves that cap; run it three times, 10 s apart: the third is refused (429 budget_exceeded)`,
          curlLine(base, runs.spec.name, runs.example, `-H 'Authorization: Bearer ${runs.key.token}'`),
          `curl -s -H 'Authorization: Bearer ${runs.key.token}' ${base}/keyward/key`,
          '',
        ]),
    '# keys of this demo, with the CLI in another terminal (a change is in force within a second):',
    `export KEYWARD_KEYS_FILE=${shellQuote(places.keysFile)}`,
    'keyward keys create --name tried --quota 3/day',
    ...(places.admin === null
      ? []
      : ['', `# health, readiness, metrics and the usage page (what each key forwarded and spent): ${places.admin}/usage`, `curl -s ${places.admin}/readyz`]),
    '',
    'Request logs follow on stderr. Ctrl-C stops the demo.',
    '',
  ].join('\n');
}

export async function runDemo(io: Io, specs: readonly UpstreamSpec[]): Promise<number> {
  const tag = randomBytes(12).toString('hex');
  const secrets = Object.fromEntries(specs.map((spec) => [spec.name, spec.sampleSecrets(`demo${tag}`)]));
  // Two accounts on one route, the first busy now and then: the retry on another credential can be watched (docs/credentials.md).
  const busy = specs.find((spec) => spec.name === BUSY_ROUTE) ?? null;
  const second = busy === null ? [] : busy.sampleSecrets(`demo2${tag}`);
  const standins = await startStandins(secrets, specs, {
    credentials: busy === null ? {} : { [busy.name]: [{ secrets: secrets[busy.name] ?? [], busyEvery: BUSY_EVERY }, { secrets: second }] },
  });
  const dir = mkdtempSync(join(tmpdir(), 'keyward-demo-'));
  let gateway: Gateway | null = null;
  let admin: Admin | null = null;
  let log: LogHandle | null = null;
  // Whatever stops the start (a port in use, a bad KEYWARD_PORT) takes the stand-ins and the folder with it.
  const cleanUp = async (): Promise<void> => {
    await admin?.close();
    await gateway?.shutdown();
    await standins.close();
    await log?.flush();
    rmSync(dir, { recursive: true, force: true });
  };
  let text: string;
  try {
    const env: Record<string, string | undefined> = {
      KEYWARD_HOST: io.env.KEYWARD_HOST,
      KEYWARD_PORT: io.env.KEYWARD_PORT,
      KEYWARD_LOG_LEVEL: io.env.KEYWARD_LOG_LEVEL,
      // Any free port unless one is asked for: a demo must not collide with a gateway on 9097.
      KEYWARD_ADMIN_HOST: io.env.KEYWARD_ADMIN_HOST,
      KEYWARD_ADMIN_PORT: io.env.KEYWARD_ADMIN_PORT ?? '0',
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      ...Object.fromEntries(specs.flatMap((spec) => Object.entries(providerEnv(spec, standins.urls[spec.name] ?? '', secrets[spec.name] ?? [])))),
      ...Object.fromEntries((busy?.secretEnvs ?? []).map((name, i) => [numberedEnv(name, 2), second[i]])),
      ...(busy === null ? {} : { [`KEYWARD_${busy.name.toUpperCase()}_CONCURRENCY`]: String(BUSY_CONCURRENCY) }),
    };
    const config = loadConfig(env, (p) => readFileSync(p, 'utf8'), io.cwd, specs);
    const store = openKeyStore(config);
    const keys = await demoKeys(store, specs);
    // Request logs go to stderr so the instructions on stdout stay readable.
    log = createLogger(config.logLevel, undefined, 2);
    const g = await createGateway(config, store, log.logger, { onRetry: (r) => io.stdout.write(`${retryLine(r)}\n`) });
    gateway = g;
    // Every port bound before the gateway says it listens (as `serve` does).
    const a =
      config.admin === null
        ? null
        : await startAdmin(
            config.admin,
            { readiness: () => g.readiness(), metrics: () => g.metrics.text(), metricsContentType: g.metrics.contentType, usage: (p) => g.usagePage(p) },
            log.logger,
            false,
          );
    admin = a;
    const address = await g.listen();
    a?.announce();
    const host = (h: string): string => (h.includes(':') ? `[${h}]` : h);
    text = demoText(`http://${host(address.address)}:${address.port}`, specs, keys, {
      keysFile: config.keysFile,
      admin: a === null || config.admin === null ? null : `http://${host(config.admin.host)}:${a.port}`,
      busy,
    });
  } catch (err) {
    await cleanUp();
    throw err;
  }
  io.stdout.write(`${text}\n`);

  return new Promise((resolve) => {
    const stop = (): void => {
      detach(
        cleanUp().then(() => resolve(0)),
        () => resolve(1),
      );
    };
    io.signals.once('SIGINT', stop);
    io.signals.once('SIGTERM', stop);
  });
}
