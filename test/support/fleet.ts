// Gateways of a fleet as real processes (`keyward serve` against one
// PostgreSQL), for the fleet's regression tests: each started with its own
// ports, stopped by SIGTERM with a deadline, its output kept for asserts.
import { startCli } from './cli.ts';
import { request } from './client.ts';
import { deadline, eventually } from './deadline.ts';

export interface FleetGateway {
  readonly base: string;
  /** The admin listener, when the environment did not turn it off. */
  readonly admin: string | null;
  output(): string;
  /** SIGTERM; resolves with the exit code and how long the exit took, ms. */
  stop(timeoutMs?: number): Promise<{ code: number | null; ms: number }>;
  kill(): void;
}

function portOf(output: string, msg: string): number | null {
  const line = output.split('\n').find((l) => l.includes(`"msg":"${msg}"`));
  return line === undefined ? null : (JSON.parse(line) as { port: number }).port;
}

/** Start `keyward serve` with `env` (KEYWARD_PORT=0 and an admin port 0 unless given). */
export async function startFleetGateway(env: Record<string, string>): Promise<FleetGateway> {
  const full = { KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: '0', ...env };
  const withAdmin = full.KEYWARD_ADMIN_PORT !== 'off';
  const gw = await startCli(['serve'], full, withAdmin ? '"msg":"admin listening"' : '"msg":"keyward listening"');
  // With workers the primary's admin listener may be up before any worker listens.
  await eventually(() => portOf(gw.output(), 'keyward listening') !== null, 20_000, 'a gateway listening');
  const adminPort = withAdmin ? portOf(gw.output(), 'admin listening') : null;
  let stopped: Promise<{ code: number | null; ms: number }> | null = null;
  return {
    base: `http://127.0.0.1:${portOf(gw.output(), 'keyward listening') as number}`,
    admin: adminPort === null ? null : `http://127.0.0.1:${adminPort}`,
    output: gw.output,
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
  };
}

/** The status a request with `token` gets on `route`. */
export async function statusOf(base: string, token: string, path = '/seo/v3/x'): Promise<number> {
  return (await request(`${base}${path}`, { headers: { authorization: `Bearer ${token}` } })).status;
}
