// `npm run bench`: keyward side by side with going direct, the naive
// http-proxy-3 peer and nginx (when installed), in one run on this machine.
// Every scenario is validated on every system before anything is timed;
// rounds are interleaved (A B C A B C) and medians of clean runs reported.
//
//   npm run bench                      full run (~10 minutes on 2 cores)
//   npm run bench -- --quick           under two minutes
//   npm run bench -- --validate-only   correctness of every scenario on every system, no timing (CI)
//   npm run bench -- --save            also write bench/results/baseline.{json,md}
//   npm run bench -- --against REF     also measure keyward at REF (a git commit, or a built checkout's directory) in the same run; repeatable
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { spawnSync } from 'node:child_process';
import { serialiseKeysFile } from '../src/keys/file-store.ts';
import type { KeyRecord } from '../src/keys/keyset.ts';
import { generateToken, tokenDigest } from '../src/keys/token.ts';
import { machine, rssBytes } from './proc.ts';
import { SCENARIOS, type Measurement, type Options } from './scenarios.ts';
import { fileUpstream, measure, missing, pin, section } from './c-streams.ts';
import { capacityRows } from './capacity.ts';
import { KEYWARD_NODE_FLAGS } from './flags.ts';
import { fmt, median, pct, range, roundOrder, spreadOf } from './stats.ts';
import { between, scrape, type Cause, type Scrape } from './tail.ts';
import {
  benchSecrets,
  deployedSecrets,
  direct,
  EVERY_LIMIT,
  keyward,
  moreCredentialsEnv,
  naive,
  nginx,
  nginxBinary,
  NODE_ARGS,
  ROOT,
  startUpstreamProcess,
  strideOf,
  type Secrets,
  type System,
} from './systems.ts';

const { values: args } = parseArgs({
  options: {
    quick: { type: 'boolean' },
    'validate-only': { type: 'boolean' },
    save: { type: 'boolean' },
    rounds: { type: 'string' },
    only: { type: 'string' },
    // Extra keyward systems with extra environment, measured in the same interleaved run:
    // --variant 'quiet:KEYWARD_LOG_LEVEL=warn' --variant 'two:KEYWARD_WORKERS=2'
    variant: { type: 'string', multiple: true },
    // The same with the bench key carrying every limit: --limited-variant 'w2:KEYWARD_WORKERS=2'
    // measures what admission costs when the primary decides for its workers.
    'limited-variant': { type: 'string', multiple: true },
    // Another version of keyward in the same interleaved run: a commit (checked out and built
    // in a temporary worktree) or a built checkout's directory: --against 2c740b9 --against ../before
    against: { type: 'string', multiple: true },
  },
});
const quick = args.quick === true;
const rounds = Number(args.rounds ?? 3);
const options: Options = quick
  ? { durationS: 1, latencyRequests: 600, slowStreams: 1000, uploads: 1 }
  : { durationS: 6, latencyRequests: 3000, slowStreams: 1000, uploads: 3 };
const slowMs = quick ? 1500 : 5000;
const manyKeys = quick ? 100_000 : 1_000_000;
const only = args.only?.split(',');

const dir = mkdtempSync(join(tmpdir(), 'keyward-bench-'));
const secrets: Secrets = benchSecrets(randomBytes(8).toString('hex'), generateToken());

/** A keys file with the bench key and `count - 1` others; `limits` on the bench key (none by default). */
/** Files made so far: each gateway gets a keys file, and so a usage ledger and a last-use file, of its own. */
let keysFileSeq = 0;
function keysFile(count: number, limits?: KeyRecord['limits']): string {
  const now = new Date().toISOString();
  const records: KeyRecord[] = [
    {
      id: 'key_bench',
      name: 'bench',
      digest: `sha256:${tokenDigest(secrets.clientToken)}`,
      created: now,
      expires: null,
      revoked: null,
      ...(limits === undefined ? {} : { limits }),
    },
  ];
  for (let i = 1; i < count; i++) {
    records.push({
      id: `key_${i.toString(16).padStart(8, '0')}`,
      name: `client-${i}`,
      digest: `sha256:${randomBytes(32).toString('hex')}`,
      created: now,
      expires: null,
      revoked: null,
    });
  }
  const path = join(dir, `keys-${count}${limits === undefined ? '' : '-limited'}-${(keysFileSeq += 1)}.json`);
  writeFileSync(path, serialiseKeysFile(records));
  return path;
}

const NAIVE = 'naive http-proxy-3';
const NAIVE_FLAGGED = "naive http-proxy-3, with keyward's Node flags";

/** `--variant 'label:ENV=value,…'` and `--limited-variant …`: a label, extra environment, and whether the key has every limit. */
function variants(): Array<[string, Record<string, string>, boolean]> {
  const all = [...(args.variant ?? []).map((v) => [v, false] as const), ...(args['limited-variant'] ?? []).map((v) => [v, true] as const)];
  return all.map(([v, limited]) => {
    const [label = v, settings = ''] = v.split(':');
    const env = Object.fromEntries(
      settings
        .split(',')
        .filter(Boolean)
        .map((kv) => [kv.slice(0, kv.indexOf('=')), kv.slice(kv.indexOf('=') + 1)]),
    );
    return [label, env, limited];
  });
}
const QUIET = 'keyward, no log line or metrics';

/**
 * keyward at a git commit, checked out into a worktree under the run's
 * directory (removed with it) and built there with this checkout's
 * node_modules: `--against REF`.
 */
function checkout(ref: string): { root: string; name: string } {
  const root = join(dir, `at-${ref.replace(/[^\w.-]/g, '_')}`);
  const git = (...argv: string[]): void => {
    const r = spawnSync('git', argv, { cwd: ROOT, stdio: ['ignore', 'ignore', 'pipe'], encoding: 'utf8' });
    if (r.status !== 0) throw new Error(`git ${argv.join(' ')}: ${r.stderr.trim()}`);
  };
  git('worktree', 'add', '--detach', root, ref);
  worktrees.push(root);
  symlinkSync(join(ROOT, 'node_modules'), join(root, 'node_modules'));
  const build = spawnSync(process.execPath, [join(ROOT, 'node_modules/typescript/bin/tsc'), '-p', 'tsconfig.build.json'], {
    cwd: root,
    stdio: ['ignore', 'ignore', 'pipe'],
    encoding: 'utf8',
  });
  if (build.status !== 0) throw new Error(`building ${ref}: ${build.stderr.trim()}`);
  writeFileSync(join(root, 'dist/.built'), '');
  return { root, name: `keyward at ${ref}` };
}
const worktrees: string[] = [];
const NO_LOG = 'keyward, no log line';
const NO_FILTER = 'keyward, egress filter off';
const LIMITED = 'keyward, key with every limit';
const THREE = 'keyward, three credentials per route';
/** The C-client rows' worst case: an 8-character voice key (reported beside the targets, not held to them). */
const WORST = 'keyward, worst case: an 8-character voice key';
const ALLOWLISTED = 'keyward, key with an allowlist';
/** Another route (speech) given a capacity: the small request's route (the scraper's) has none and must cost what it did. */
const CAPACITY = 'keyward, a capacity on another route';
/** Systems measured in some scenarios only (the rest would add minutes and say nothing new). */
const ONLY: ReadonlyMap<string, readonly string[]> = new Map([
  [QUIET, ['small']],
  [NO_LOG, ['small']],
  [NO_FILTER, ['small', 'stream', 'json']],
  [LIMITED, ['small']],
  [THREE, ['small', 'stream', 'json']],
  [ALLOWLISTED, ['small']],
  [CAPACITY, ['small']],
]);
const runs = (system: string, scenario: string): boolean => ONLY.get(system)?.includes(scenario) ?? true;

const log = (text: string): void => void process.stderr.write(`${text}\n`);
/** One readable progress line per measured run (stderr; the report goes to stdout and to files). */
function progress(m: Measurement): string {
  const parts = [`${m.requests.toLocaleString('en')} ok`];
  if (m.errors > 0) parts.push(`${m.errors} errors (round discarded)`);
  if (m.rps !== null) parts.push(`${fmt(m.rps, 0)} req/s`);
  if (m.cpuUsPerReq !== null) parts.push(`${fmt(m.cpuUsPerReq, 0)} µs CPU/req`);
  if (m.mbps !== null) parts.push(`${fmt(m.mbps, 0)} MB/s`);
  if (m.p99Ms !== null) parts.push(`p99 ${fmt(m.p99Ms, 2)} ms`);
  if (m.p999Ms !== null) parts.push(`p99.9 ${fmt(m.p999Ms, 2)} ms`);
  return parts.join(', ');
}

type Summary = Record<keyof Omit<Measurement, 'requests' | 'errors'>, number | null> & {
  runs: number;
  discarded: number;
  spread: Partial<Record<keyof Measurement, number>>;
};

function summarise(runs: Measurement[]): Summary {
  const clean = runs.filter((r) => r.errors === 0 && r.requests > 0);
  const values = (k: keyof Measurement): number[] => clean.map((r) => r[k]).filter((v): v is number => typeof v === 'number');
  const pick = (k: keyof Measurement): number | null => median(values(k));
  const spread: Summary['spread'] = {};
  for (const k of ['rps', 'p50Ms', 'p99Ms', 'p999Ms', 'cpuUsPerReq', 'mbps', 'peakRssMb'] as const) {
    const sp = spreadOf(values(k));
    if (sp !== undefined) spread[k] = sp;
  }
  return {
    rps: pick('rps'),
    p50Ms: pick('p50Ms'),
    p99Ms: pick('p99Ms'),
    p999Ms: pick('p999Ms'),
    cpuUsPerReq: pick('cpuUsPerReq'),
    mbps: pick('mbps'),
    peakRssMb: pick('peakRssMb'),
    runs: clean.length,
    discarded: runs.length - clean.length,
    spread,
  };
}

async function main(): Promise<void> {
  const started = Date.now();
  const up = await startUpstreamProcess(secrets, slowMs);
  const systems: System[] = [direct(up.port, up.pid, secrets)];
  const stopAll = async (): Promise<void> => {
    await Promise.all(systems.map((s) => s.stop()));
    await up.stop();
  };
  const scenarios = SCENARIOS.filter((s) => only === undefined || only.includes(s.name));

  try {
    systems.push(await keyward(up.port, secrets, keysFile(10)));
    // The same gateway without its request log line (level warn) and without
    // metrics (no admin listener, so nothing is recorded): the difference in
    // CPU per small request is what the line and the metrics cost together.
    systems.push(await keyward(up.port, secrets, keysFile(10), NO_LOG, { KEYWARD_LOG_LEVEL: 'warn' }));
    systems.push(await keyward(up.port, secrets, keysFile(10), QUIET, { KEYWARD_LOG_LEVEL: 'warn', KEYWARD_ADMIN_PORT: 'off' }));
    // The same gateway without the egress filter: what scanning responses for upstream secrets costs.
    systems.push(await keyward(up.port, secrets, keysFile(10), NO_FILTER, { KEYWARD_EGRESS_FILTER: 'off' }));
    // The same gateway whose bench key has every limit (none reached): admission and the ledger per request.
    systems.push(await keyward(up.port, secrets, keysFile(10, EVERY_LIMIT), LIMITED));
    // Three credentials on every route, none refused: what choosing one per request and a larger scan table cost.
    systems.push(await keyward(up.port, secrets, keysFile(10), THREE, moreCredentialsEnv(secrets)));
    // The bench key limited to loopback (every request allowed): what checking the client address costs. The plain
    // keyward row is the same gateway with no key holding an allowlist.
    systems.push(await keyward(up.port, secrets, keysFile(10, { allowFrom: ['10.0.0.0/8', '127.0.0.0/8', '::1'] }), ALLOWLISTED));
    systems.push(await keyward(up.port, secrets, keysFile(10), CAPACITY, { KEYWARD_SPEECH_CONCURRENCY: '4' }));
    for (const [label, env, limited] of variants()) {
      systems.push(
        await keyward(up.port, secrets, keysFile(10, limited ? EVERY_LIMIT : undefined), `keyward ${label}${limited ? ', key with every limit' : ''}`, env),
      );
    }
    for (const other of args.against ?? []) {
      const built = existsSync(other) ? { root: resolve(other), name: `keyward, build in ${basename(resolve(other))}` } : checkout(other);
      systems.push(await keyward(up.port, secrets, keysFile(10), built.name, {}, undefined, built.root));
    }
    systems.push(await naive(up.port, secrets));
    const nginxBin = nginxBinary();
    if (nginxBin !== null) systems.push(await nginx(nginxBin, up.port, secrets, dir));
    else log('nginx not installed: comparing without it (apt-get install nginx-light to include it)');
    // 1. Validation: every scenario on every system must give the right answer first.
    let validated = 0;
    for (const scenario of scenarios) {
      for (const sys of systems) {
        if (!runs(sys.name, scenario.name)) continue;
        await scenario.validate(sys);
        validated++;
      }
    }
    log(`validation passed: ${validated} scenario runs on ${systems.length} systems (${systems.map((s) => s.name).join(', ')})`);
    if (args['validate-only'] === true) {
      process.stdout.write(`bench validation: ${validated} passed, 0 failed\n`);
      return;
    }

    // 2. Interleaved rounds.
    const results: Record<string, Record<string, Measurement[]>> = {};
    /** keyward's event-loop tasks and collections over the small scenario's rounds. */
    let tail: Cause[] = [];
    for (const scenario of scenarios) {
      results[scenario.name] = {};
      // A warm-up round first, not recorded: JIT, connection pools and the
      // allocator settle (a first round ran 402 µs per request where the third ran 280).
      // Scenarios on fresh processes have nothing to warm.
      const first = scenario.fresh === true ? 0 : -1;
      let tailBefore: Scrape | null = null;
      const watched = systems.find((x) => x.name === 'keyward');
      for (let round = first; round < rounds; round++) {
        if (round === 0 && scenario.name === 'small' && watched?.admin !== undefined) tailBefore = await scrape(watched.admin);
        // Each round runs the systems in an order of its own (a shuffle
        // seeded by the round), so no system always follows the same one.
        // Rounds that only started one system further on (A B C, then B C A)
        // kept the cycle: keyward always ran right after "direct", which
        // loads the upstream and the bench's own client hardest
        // (bench/README.md).
        const order = roundOrder(systems.length, round - first);
        for (let k = 0; k < systems.length; k++) {
          const i = order[k] as number;
          const current = systems[i] as System;
          if (!runs(current.name, scenario.name)) continue;
          const sys = scenario.fresh === true && current.restart !== undefined ? await current.restart() : current;
          systems[i] = sys;
          const m = await scenario.run(sys, round < 0 ? { ...options, durationS: Math.max(1, Math.ceil(options.durationS / 2)), uploads: 1 } : options);
          if (round >= 0) ((results[scenario.name] as Record<string, Measurement[]>)[sys.name] ??= []).push(m);
          log(`${scenario.name.padEnd(7)} ${round < 0 ? 'warm-up' : `round ${round + 1}/${rounds}`} ${sys.name.padEnd(34)} ${progress(m)}`);
        }
      }
      if (tailBefore !== null && watched?.admin !== undefined) tail = between(tailBefore, await scrape(watched.admin));
    }
    await stopAll();

    // 3. Key scale: auth cost with 10 and with many keys, the two gateways interleaved.
    const keyScale: Record<string, { startupMs: number; loadMs: number; rssMb: number; latency: Measurement[] }> = {};
    if (only === undefined || only.includes('keys')) {
      const up2 = await startUpstreamProcess(secrets, slowMs);
      const latency = SCENARIOS.find((s) => s.name === 'latency');
      const counts = [10, manyKeys];
      const gateways = [];
      for (const count of counts) {
        const logFile = join(dir, `keyward-${count}.log`);
        const g = await keyward(up2.port, secrets, keysFile(count), `keyward, ${count.toLocaleString('en')} keys`, {}, logFile);
        // The gateway's own measure of reading, checking and indexing the keys file. Log
        // lines are written in 4 KiB batches or within a second: wait for the line.
        let started: string | undefined;
        for (let waited = 0; started === undefined && waited < 3000; waited += 50) {
          started = readFileSync(logFile, 'utf8')
            .split('\n')
            .find((l) => l.includes('keyward listening'));
          if (started === undefined) await new Promise((r) => setTimeout(r, 50));
        }
        started ??= '{}';
        const loadMs = (JSON.parse(started) as { keysLoadMs?: number }).keysLoadMs ?? NaN;
        keyScale[g.name] = { startupMs: g.startupMs, loadMs, rssMb: rssBytes([g.pid as number]) / 1024 / 1024, latency: [] };
        gateways.push(g);
      }
      for (let round = 0; round < rounds; round++) {
        for (const g of gateways) keyScale[g.name]?.latency.push(await (latency as (typeof SCENARIOS)[number]).run(g, options));
      }
      await Promise.all(gateways.map((g) => g.stop()));
      await up2.stop();
    }

    // 4. Streams with a C client and an nginx upstream, the gateway on a core of its own (bench/c-streams.ts).
    let cStreams: ReturnType<typeof section> | null = null;
    if (only === undefined || only.includes('c-stream')) cStreams = await withCClient();

    // 5. A burst on accounts of a known capacity, with the option and without (bench/capacity.ts).
    let capacity: Awaited<ReturnType<typeof capacityRows>> | null = null;
    if (only === undefined || only.includes('capacity')) {
      const up3 = await startUpstreamProcess(secrets, slowMs);
      try {
        capacity = await capacityRows((ports, name, env) => keyward(ports, secrets, keysFile(10), name, env), up3.port, secrets, rounds, log);
      } finally {
        await up3.stop();
      }
    }

    // The log line on its own, in a child whose stdout is /dev/null (bench/log-line.ts).
    let logLine: LogLine | null = null;
    if (only === undefined || only.includes('small')) {
      const out = spawnSync(process.execPath, [...NODE_ARGS, join(ROOT, 'bench/log-line.ts'), quick ? '100000' : '400000'], {
        stdio: ['ignore', 'ignore', 'pipe'],
        encoding: 'utf8',
        timeout: 120_000,
      });
      if (out.status === 0) logLine = JSON.parse(out.stderr.trim().split('\n').at(-1) as string) as LogLine;
      else log(`log line measurement failed: ${out.stderr}`);
    }

    report(
      results,
      keyScale,
      systems.map((s) => s.name),
      Date.now() - started,
      logLine,
      tail,
      cStreams,
      capacity,
    );
  } finally {
    await stopAll();
    for (const w of worktrees) spawnSync('git', ['worktree', 'remove', '--force', w], { cwd: ROOT, stdio: 'ignore' });
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * The stream rows that a shared machine cannot flatter: keyward, the same
 * with the filter off, the naive peer, nginx and any `--against` build, each
 * pinned to a core of its own in turn, against nginx serving the bodies.
 */
async function withCClient(): Promise<ReturnType<typeof section> | null> {
  const nginxBin = nginxBinary();
  const lacking = missing(nginxBin);
  if (lacking !== null || nginxBin === null) {
    log(`streams with a C client skipped: ${lacking ?? 'nginx not installed'}`);
    return null;
  }
  const cdir = join(dir, 'c-streams');
  // As deployed: the providers' real secret lengths, each route on an origin of its own (docs/security.md).
  const deployed = deployedSecrets(secrets.clientToken);
  const upstream = await fileUpstream(nginxBin, deployed, join(cdir, 'upstream'));
  const up = upstream.ports;
  const gateways: System[] = [];
  try {
    gateways.push(await keyward(up, deployed, keysFile(10)));
    gateways.push(await keyward(up, deployed, keysFile(10), NO_FILTER, { KEYWARD_EGRESS_FILTER: 'off' }));
    gateways.push(await keyward(up, deployed, keysFile(10), THREE, moreCredentialsEnv(deployed)));
    // Reported, not held to the targets: the shortest secret keyward scans for, on the streaming route.
    gateways.push(await keyward(up, deployed, keysFile(10), WORST, { KEYWARD_SPEECH_KEY: deployed.worst?.speech?.[0] ?? '' }));
    for (const [label, env, limited] of variants())
      gateways.push(
        await keyward(up, deployed, keysFile(10, limited ? EVERY_LIMIT : undefined), `keyward ${label}${limited ? ', key with every limit' : ''}`, env),
      );
    for (const [i, other] of (args.against ?? []).entries()) {
      const root = existsSync(other) ? resolve(other) : join(dir, `at-${other.replace(/[^\w.-]/g, '_')}`);
      const name = existsSync(other) ? `keyward, build in ${basename(root)}` : `keyward at ${other}`;
      if (existsSync(join(root, 'dist'))) gateways.push(await keyward(up, deployed, keysFile(10), name, {}, undefined, root));
      else log(`--against ${other} (${i + 1}): no build to measure with the C client`);
    }
    gateways.push(await naive(up, deployed));
    // Reported beside it: the same peer given the Node flags bin/keyward starts with (bench/README.md,
    // "Collections driven by bytes outside the heap"), so what is the flags' and what is keyward's reads apart.
    gateways.push(await naive(up, deployed, KEYWARD_NODE_FLAGS, NAIVE_FLAGGED));
    mkdirSync(join(cdir, 'gateway'), { recursive: true });
    gateways.push(await nginx(nginxBin, up, deployed, join(cdir, 'gateway')));
    for (const g of gateways) pin(g.pid as number, '0');
    pin(process.pid, '1');
    const results = await measure(gateways, options.durationS, rounds, cdir, log);
    return section(
      results,
      gateways.map((g) => g.name),
      NAIVE,
      NO_FILTER,
      THREE,
      {
        keyward: (route) => strideOf(deployed, route),
        [THREE]: (route) => strideOf(deployed, route, false, 3),
        [WORST]: (route) => strideOf(deployed, route, true),
      },
    );
  } finally {
    await Promise.all(gateways.map((g) => g.stop()));
    await upstream.stop();
  }
}

type Key = 'cpuUsPerReq' | 'mbps' | 'p99Ms' | 'p999Ms';

/** `a`'s measure over `b`'s, round by round (rounds are interleaved, so each pair ran back to back on the same machine state). */
function paired(a: Measurement[] | undefined, b: Measurement[] | undefined, k: Key): number[] {
  return (a ?? []).map((m, i) => (m.errors === 0 ? (m[k] ?? NaN) : NaN) / ((b ?? [])[i]?.[k] ?? NaN)).filter((x) => Number.isFinite(x));
}

interface LogLine {
  templateUs: number;
  pinoUs: number;
}

/** One ratio against a stated bound (docs/performance.md): the median of the round-by-round ratios, their range, and whether it holds. */
interface Target {
  readonly label: string;
  readonly rounds: number[];
  readonly bound: number;
  readonly cmp: '<=' | '>=';
  readonly unit: string;
}

function report(
  results: Record<string, Record<string, Measurement[]>>,
  keyScale: Record<string, { startupMs: number; loadMs: number; rssMb: number; latency: Measurement[] }>,
  names: string[],
  elapsedMs: number,
  logLine: LogLine | null,
  tail: Cause[],
  cStreams: ReturnType<typeof section> | null,
  capacity: Awaited<ReturnType<typeof capacityRows>> | null,
): void {
  const lines: string[] = [];
  const summaries: Record<string, Record<string, Summary>> = {};
  lines.push(
    `# keyward benchmark${quick ? ' (quick)' : ''}`,
    '',
    `Machine: ${machine()}. One warm-up round, then ${rounds} interleaved rounds; medians of clean runs (runs with any error, timeout or non-2xx are discarded), ±: half the range over the rounds as a share of the median, so a difference smaller than that is noise. CPU is each system's whole process tree (from per-thread schedstat); "direct" has no process of its own, so no CPU or RSS. Latencies are each request's own, to the microsecond. ${new Date().toISOString().slice(0, 10)}, ${Math.round(elapsedMs / 1000)} s.`,
    '',
  );
  for (const scenario of SCENARIOS) {
    const bySystem = results[scenario.name];
    if (bySystem === undefined) continue;
    summaries[scenario.name] = {};
    lines.push(
      `## ${scenario.title}`,
      '',
      `| system | req/s | p50 ms | p99 ms | p99.9 ms | CPU µs/req | MB/s | peak RSS MB | clean runs |`,
      '|---|---:|---:|---:|---:|---:|---:|---:|---:|',
    );
    for (const name of names) {
      if (!runs(name, scenario.name)) continue;
      const s = summarise(bySystem[name] ?? []);
      (summaries[scenario.name] as Record<string, Summary>)[name] = s;
      const sp = s.spread;
      lines.push(
        `| ${name} | ${fmt(s.rps, 0)}${pct(sp.rps)} | ${fmt(s.p50Ms, 3)} | ${fmt(s.p99Ms, 2)}${pct(sp.p99Ms)} | ${fmt(s.p999Ms, 2)}${pct(sp.p999Ms)} | ${fmt(s.cpuUsPerReq, 0)}${pct(sp.cpuUsPerReq)} | ${fmt(s.mbps, 1)}${pct(sp.mbps)} | ${fmt(s.peakRssMb, 0)} | ${s.runs}/${s.runs + s.discarded} |`,
      );
    }
    const k = (summaries[scenario.name] as Record<string, Summary>).keyward;
    const ratios = names
      .filter((n) => n !== 'keyward' && runs(n, scenario.name))
      .map((n) => {
        const o = (summaries[scenario.name] as Record<string, Summary>)[n];
        const parts: string[] = [];
        if (k?.rps && o?.rps) parts.push(`req/s ${fmt(k.rps / o.rps, 2)}×`);
        const cpu = paired(bySystem.keyward, bySystem[n], 'cpuUsPerReq');
        if (k?.cpuUsPerReq && o?.cpuUsPerReq) parts.push(`CPU/req ${fmt(k.cpuUsPerReq / o.cpuUsPerReq, 2)}×${cpu.length > 1 ? ` (rounds ${range(cpu)})` : ''}`);
        if (k?.mbps && o?.mbps) parts.push(`MB/s ${fmt(k.mbps / o.mbps, 2)}×`);
        if (k?.p99Ms && o?.p99Ms) parts.push(`p99 ${fmt(k.p99Ms / o.p99Ms, 2)}×`);
        if (k?.peakRssMb && o?.peakRssMb) parts.push(`RSS ${fmt(k.peakRssMb / o.peakRssMb, 2)}×`);
        return parts.length > 0 ? `vs ${n}: ${parts.join(', ')}` : '';
      })
      .filter((t) => t !== '');
    lines.push('', `keyward ${ratios.join('; ')}.`, '');
  }
  const ks = Object.entries(keyScale).map(([name, v]) => ({ name, startupMs: v.startupMs, loadMs: v.loadMs, rssMb: v.rssMb, ...summarise(v.latency) }));
  if (ks.length > 0) {
    lines.push(
      '## key scale: one-connection latency with few and many keys',
      '',
      '| gateway | keys load ms | process start to ready ms | RSS MB | p50 ms | p99 ms |',
      '|---|---:|---:|---:|---:|---:|',
    );
    for (const k of ks) lines.push(`| ${k.name} | ${k.loadMs} | ${k.startupMs} | ${fmt(k.rssMb, 0)} | ${fmt(k.p50Ms, 3)} | ${fmt(k.p99Ms, 3)} |`);
    lines.push('');
  }

  const get = (scenario: string, sys: string): Summary | undefined => summaries[scenario]?.[sys];
  const ratio = (a: number | null | undefined, b: number | null | undefined): number | null => (a && b ? a / b : null);
  // The ratios the gateway is held to (docs/performance.md), each against the naive peer or itself in the same run.
  const targets: Target[] = [];
  const against = (label: string, scenario: string, a: string, b: string, k: Key, bound: number, cmp: '<=' | '>='): void => {
    const r = paired(results[scenario]?.[a], results[scenario]?.[b], k);
    if (r.length > 0) targets.push({ label, rounds: r, bound, cmp, unit: '×' });
  };
  against('small request: CPU per request vs the naive peer', 'small', 'keyward', NAIVE, 'cpuUsPerReq', 1.15, '<=');
  against('small request, key with every limit: CPU per request vs the naive peer', 'small', LIMITED, NAIVE, 'cpuUsPerReq', 1.25, '<=');
  against('small request: p99 at 64 connections vs the naive peer', 'small', 'keyward', NAIVE, 'p99Ms', 1.5, '<=');
  against('10 MiB binary stream, Node clients (second opinion): throughput vs the naive peer', 'stream', 'keyward', NAIVE, 'mbps', 0.95, '>=');
  against('10 MiB JSON dataset, Node clients (second opinion): throughput vs the naive peer', 'json', 'keyward', NAIVE, 'mbps', 0.95, '>=');
  against('small request: three credentials per route vs one, CPU per request', 'small', THREE, 'keyward', 'cpuUsPerReq', 1.05, '<=');
  against('small request: a key with an allowlist vs one without, CPU per request', 'small', ALLOWLISTED, 'keyward', 'cpuUsPerReq', 1.05, '<=');
  against('small request: a capacity on another route vs none, CPU per request', 'small', CAPACITY, 'keyward', 'cpuUsPerReq', 1.05, '<=');
  against(
    '10 MiB binary stream, Node clients (second opinion): three credentials per route vs one, throughput',
    'stream',
    THREE,
    'keyward',
    'mbps',
    0.95,
    '>=',
  );
  against('10 MiB binary stream, Node clients (second opinion): egress filter on vs off, throughput', 'stream', 'keyward', NO_FILTER, 'mbps', 0.95, '>=');
  against('10 MiB JSON dataset, Node clients (second opinion): egress filter on vs off, throughput', 'json', 'keyward', NO_FILTER, 'mbps', 0.95, '>=');
  if (cStreams !== null) {
    lines.push(...cStreams.lines);
    targets.push(...cStreams.targets);
  }
  const p999 = paired(results.small?.keyward, results.small?.[NAIVE], 'p999Ms');
  const filterStream = paired(results.stream?.keyward, results.stream?.[NO_FILTER], 'mbps');

  // Budgets stated elsewhere in the docs, by difference against the same gateway without the part, round by round.
  const perRound = (a: string, b: string): number[] =>
    (results.small?.[a] ?? []).map((m, i) => (m.cpuUsPerReq ?? NaN) - ((results.small?.[b] ?? [])[i]?.cpuUsPerReq ?? NaN)).filter((x) => Number.isFinite(x));
  const budgets: Array<[string, number | null, string, boolean | null]> = [];
  const budget = (label: string, value: number | null, bound: number, cmp: '<=' | '>=', unit: string): void => {
    budgets.push([label, value, `${cmp} ${bound}${unit}`, value === null ? null : cmp === '<=' ? value <= bound : value >= bound]);
  };
  const logCost = median(perRound('keyward', NO_LOG));
  const metricsCost = median(perRound(NO_LOG, QUIET));
  if (logCost !== null && metricsCost !== null) {
    lines.push(
      '## log line and metrics',
      '',
      `CPU per small request, same run, medians of the round-by-round differences: the request log line at \`info\` costs **${fmt(logCost, 1)} µs** (keyward minus "${NO_LOG}"; rounds ${perRound(
        'keyward',
        NO_LOG,
      )
        .map((x) => fmt(x, 1))
        .join(', ')}); the metrics **${fmt(metricsCost, 1)} µs** ("${NO_LOG}" minus "${QUIET}"; rounds ${perRound(NO_LOG, QUIET)
        .map((x) => fmt(x, 1))
        .join(', ')}). Each round's difference is as noisy as the rounds themselves (see ± above): read the median.`,
      '',
    );
  }
  const filterCost = median(perRound('keyward', NO_FILTER));
  const filterJson = paired(results.json?.keyward, results.json?.[NO_FILTER], 'mbps');
  if (filterCost !== null || filterStream.length > 0) {
    lines.push(
      '## egress filter',
      '',
      `Scanning every response for the upstream secrets, same run, medians of the round-by-round comparisons with "${NO_FILTER}": **${fmt(filterCost, 1)} µs** of CPU per small request (rounds ${perRound(
        'keyward',
        NO_FILTER,
      )
        .map((x) => fmt(x, 1))
        .join(
          ', ',
        )}); the 10 MiB binary stream at **${fmt(median(filterStream), 3)}×** the throughput (rounds ${filterStream.map((x) => fmt(x, 3)).join(', ')}); the 10 MiB JSON dataset at **${fmt(median(filterJson), 3)}×** (rounds ${filterJson.map((x) => fmt(x, 3)).join(', ')}). A difference inside the rounds' spread is noise.`,
      '',
    );
  }
  const limitsCost = median(perRound(LIMITED, 'keyward'));
  if (limitsCost !== null) {
    lines.push(
      '## per-key limits',
      '',
      `The bench key with every limit set (rate, burst, concurrency, quota, budgets, the scraper's included: the small request is a run-start, capped and its run settled; none reached) against the same gateway whose key has none, same run, small request: **${fmt(limitsCost, 1)} µs** of CPU per request (rounds ${perRound(
        LIMITED,
        'keyward',
      )
        .map((x) => fmt(x, 1))
        .join(', ')}). Keys without limits are not checked; every key's requests go to the ledger in both.`,
      '',
    );
  }
  if (logLine !== null) {
    lines.push(
      `The line on its own (\`bench/log-line.ts\`: the gateway's logger writing the request line to /dev/null, CPU of the whole process, the bare loop subtracted): **${fmt(logLine.templateUs, 2)} µs** per line; pino's generic \`logger.info(fields, msg)\` for the same fields through the same destination: ${fmt(logLine.pinoUs, 2)} µs.`,
      '',
    );
    budget('log line cost (on its own)', logLine.templateUs, 5, '<=', ' µs');
  }
  if (limitsCost !== null) budget('limits: CPU per small request, every limit vs none', limitsCost, 3, '<=', ' µs');
  if (capacity !== null) {
    lines.push(...capacity.lines);
    for (const [label, value, bound, cmp, unit] of capacity.budgets) budget(label, value, bound, cmp, unit);
  }
  const slowRuns = results.slow?.keyward ?? [];
  if (slowRuns.length > 0) {
    budget('slow streams: keyward peak RSS', get('slow', 'keyward')?.peakRssMb ?? null, 150, '<=', ' MB');
    budget(
      'slow streams: keyward errors',
      slowRuns.reduce((n, r) => n + r.errors, 0),
      0,
      '<=',
      '',
    );
  }
  if (ks.length === 2) {
    budget(`auth p50 with ${manyKeys.toLocaleString('en')} keys vs 10 keys`, ratio(ks[1]?.p50Ms, ks[0]?.p50Ms), 1.1, '<=', '×');
    budget(`${manyKeys.toLocaleString('en')} keys: load time`, (ks[1]?.loadMs ?? NaN) / 1000, 3, '<=', ' s');
  }

  if (tail.length > 0) {
    const served = (results.small?.keyward ?? []).reduce((n, m) => n + m.requests, 0);
    lines.push(
      "## the tail: what held keyward's event loop (small requests)",
      '',
      `From keyward's own metrics (\`keyward_loop_task_seconds\`, \`nodejs_gc_duration_seconds\`) over the measured rounds (${served.toLocaleString('en')} requests); no request moves while one of these runs. p99 and max are the upper bounds of their histogram buckets.`,
      '',
      '| cause | runs | per 1,000 requests | total ms | p99 ms | max ms |',
      '|---|---:|---:|---:|---:|---:|',
      ...tail.map(
        (c) => `| ${c.cause} | ${c.runs} | ${fmt((c.runs * 1000) / Math.max(1, served), 1)} | ${fmt(c.totalMs, 1)} | ${fmt(c.p99Ms, 2)} | ${fmt(c.maxMs, 2)} |`,
      ),
      '',
    );
  }
  lines.push(
    '## against the naive peer (docs/performance.md)',
    '',
    'Each ratio is the median of the round-by-round ratios (each round ran both systems back to back), with the range over the rounds.',
    '',
    '| ratio | measured | rounds | target | holds |',
    '|---|---:|---:|---:|---|',
  );
  const failed: string[] = [];
  for (const t of targets) {
    const m = median(t.rounds) as number;
    const ok = t.cmp === '<=' ? m <= t.bound : m >= t.bound;
    if (!ok) failed.push(t.label);
    lines.push(`| ${t.label} | ${fmt(m, 2)}${t.unit} | ${range(t.rounds)} | ${t.cmp} ${t.bound}${t.unit} | ${ok ? 'yes' : 'NO'} |`);
  }
  if (p999.length > 0)
    lines.push(`| small request: p99.9 at 64 connections vs the naive peer (no target) | ${fmt(median(p999), 2)}× | ${range(p999)} | — | — |`);
  lines.push('', '## other budgets', '', '| budget | measured | bound | holds |', '|---|---:|---:|---|');
  for (const [label, value, bound, ok] of budgets) {
    if (ok === false) failed.push(label);
    lines.push(`| ${label} | ${fmt(value, 2)} | ${bound} | ${ok === null ? 'not measured' : ok ? 'yes' : 'NO'} |`);
  }
  const k = get('small', 'keyward');
  const measured = targets.length + budgets.filter(([, , , ok]) => ok !== null).length;
  const verdict = `Verdict: ${measured - failed.length} of ${measured} hold${failed.length > 0 ? ` (missed: ${failed.join('; ')})` : ''}. keyward served small requests at ${fmt(k?.rps, 0)} req/s for ${fmt(k?.cpuUsPerReq, 0)} µs of CPU each${get('small', 'nginx') ? `, against nginx's ${fmt(get('small', 'nginx')?.cpuUsPerReq, 0)} µs` : ''} and the naive peer's ${fmt(get('small', NAIVE)?.cpuUsPerReq, 0)} µs; it streamed ${fmt(get('stream', 'keyward')?.mbps, 0)} MB/s of audio and ${fmt(get('json', 'keyward')?.mbps, 0)} MB/s of JSON where the naive peer gave ${fmt(get('stream', NAIVE)?.mbps, 0)} and ${fmt(get('json', NAIVE)?.mbps, 0)}. These are ratios from one run on this machine; absolute figures on a shared machine are noise.`;
  lines.push('', verdict, '');
  const markdown = lines.join('\n');
  process.stdout.write(`${markdown}\n`);
  const json = JSON.stringify(
    {
      machine: machine(),
      quick,
      rounds,
      date: new Date().toISOString(),
      summaries,
      keyScale: ks,
      targets: targets.map((t) => ({ label: t.label, value: median(t.rounds), rounds: t.rounds, bound: `${t.cmp} ${t.bound}${t.unit}` })),
      budgets: budgets.map(([label, value, bound, ok]) => ({ label, value, bound, ok })),
      raw: results,
    },
    null,
    2,
  );
  const resultsDir = new URL('./results/', import.meta.url);
  writeFileSync(new URL('latest.local.json', resultsDir), json);
  writeFileSync(new URL('latest.local.md', resultsDir), markdown);
  const written = [new URL('latest.local.md', resultsDir), new URL('latest.local.json', resultsDir)];
  if (args.save === true) {
    writeFileSync(new URL(`baseline${quick ? '-quick' : ''}.json`, resultsDir), json);
    writeFileSync(new URL(`baseline${quick ? '-quick' : ''}.md`, resultsDir), markdown);
    written.push(new URL(`baseline${quick ? '-quick' : ''}.md`, resultsDir), new URL(`baseline${quick ? '-quick' : ''}.json`, resultsDir));
  }
  log(`results written to ${written.map((u) => relative(process.cwd(), fileURLToPath(u))).join(', ')}`);
}

main().catch((err: unknown) => {
  log(`bench failed: ${(err as Error).message}`);
  process.exitCode = 1;
});
