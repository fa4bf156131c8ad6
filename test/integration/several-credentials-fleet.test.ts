// docs/credentials.md, "Everywhere the same": a credential set aside by one
// gateway process is set aside by every worker of its machine and every
// gateway of a fleet within a second, and comes back at the same instant on
// all. Real processes: `keyward serve` with KEYWARD_WORKERS=2, and three
// gateways on one real PostgreSQL.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import type http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli, startCli } from '../support/cli.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { withFleet, type FleetGateway } from '../support/fleet.ts';
import { startUpstream, type Handler } from '../support/upstream.ts';

/** The SEO credential (by login) a request carried: 1 for `l`, 2 for `l2`. */
function labelOf(headers: http.IncomingHttpHeaders): number {
  const basic = /^Basic (.+)$/.exec(headers.authorization ?? '')?.[1] ?? '';
  const login = Buffer.from(basic, 'base64').toString().split(':')[0];
  return login === 'l' ? 1 : login === 'l2' ? 2 : 0;
}

/** Credential 1 answers 429 (Retry-After `wait` s) while `refusing` is on; everything else 200. */
function refusingFirst(state: { refusing: boolean; wait: string }): Handler {
  return (req, res) => {
    req.resume();
    req.on('end', () => {
      const label = labelOf(req.headers);
      const status = label === 1 && state.refusing ? 429 : 200;
      const body = JSON.stringify({ credential: label });
      res.writeHead(status, {
        'content-type': 'application/json',
        'content-length': Buffer.byteLength(body),
        ...(status === 429 ? { 'retry-after': state.wait } : {}),
      });
      res.end(body);
    });
  };
}

const available = async (admin: string): Promise<number | undefined> => {
  const r = await request(`${admin}/readyz`);
  return (JSON.parse(r.body.toString()) as { credentials?: Record<string, { available: number }> }).credentials?.seo?.available;
};

const TWO = { KEYWARD_SEO_LOGIN_2: 'l2', KEYWARD_SEO_PASSWORD_2: 'p2', KEYWARD_CREDENTIAL_ORDER: 'first' };

test('KEYWARD_WORKERS=2: a credential one worker sets aside is aside in the other within a second', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-creds-w-'));
  const state = { refusing: true, wait: '4' };
  const up = await startUpstream(refusingFirst(state));
  const env = {
    KEYWARD_PORT: '0',
    KEYWARD_ADMIN_PORT: '0',
    KEYWARD_WORKERS: '2',
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    ...TWO,
  };
  const key = JSON.parse((await runCli(['keys', 'create', '--name', 'w', '--json'], env)).stdout) as { token: string };
  const serve = await startCli(['serve'], env, '"msg":"admin listening"');
  try {
    await eventually(() => serve.output().split('"msg":"keyward listening"').length === 3, 10_000, 'two workers listening');
    const port = (s: string): number =>
      (
        JSON.parse(
          serve
            .output()
            .split('\n')
            .find((l) => l.includes(`"msg":"${s}"`)) as string,
        ) as { port: number }
      ).port;
    const admin = `http://127.0.0.1:${port('admin listening')}`;
    const base = `http://127.0.0.1:${port('keyward listening')}`;
    await eventually(async () => (await request(`${admin}/readyz`)).status === 200, 5_000, 'ready');
    const first = await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } });
    assert.equal(first.status, 200, 'retried on credential 2');
    const at = performance.now();
    // Each new connection goes to a worker in turn: within a second, none sends to credential 1.
    await eventually(
      async () => {
        const before = up.requests.length;
        await Promise.all(Array.from({ length: 4 }, () => request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } })));
        return up.requests.slice(before).every((r) => labelOf(r.headers) === 2);
      },
      1_000,
      'credential 1 aside in both workers',
    );
    assert.ok(performance.now() - at < 1_000);
    assert.equal(await available(admin), 1);
    // Back on every worker once its Retry-After passed.
    state.refusing = false;
    await eventually(async () => (await available(admin)) === 2, 8_000, 'back');
    const back = await Promise.all(Array.from({ length: 4 }, () => request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } })));
    for (const r of back) assert.equal(JSON.parse(r.body.toString()).credential, 1);
  } finally {
    serve.child.kill('SIGTERM');
    await deadline(serve.done, 10_000, 'exit');
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('three gateways on one PostgreSQL: a credential one sets aside is aside on all within a second, and back on all at the same instant', async () => {
  const state = { refusing: true, wait: '5' };
  await withFleet(
    async (f) => {
      const key = await f.key('fleet-creds');
      const gws: FleetGateway[] = [await f.gateway(), await f.gateway(), await f.gateway()];
      const admins = gws.map((g) => g.admin as string);
      for (const a of admins) assert.equal(await available(a), 2);
      const [a, b, c] = gws as [FleetGateway, FleetGateway, FleetGateway];
      const r = await request(`${a.base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } });
      assert.equal(r.status, 200);
      assert.equal(JSON.parse(r.body.toString()).credential, 2, 'sent again on credential 2');
      const seen = performance.now();
      await eventually(async () => (await available(admins[1] as string)) === 1 && (await available(admins[2] as string)) === 1, 1_000, 'aside on all three');
      const within = performance.now() - seen;
      assert.ok(within < 1_000, `${within} ms`);
      // B and C send nothing to credential 1 meanwhile.
      const before = f.up.requests.length;
      for (const g of [b, c]) assert.equal((await request(`${g.base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } })).status, 200);
      assert.deepEqual(
        f.up.requests.slice(before).map((x) => labelOf(x.headers)),
        [2, 2],
      );
      // Back at the same instant: each gateway's readiness flips within a poll of the others'.
      state.refusing = false;
      const backAt = await Promise.all(
        admins.map(async (adm) => {
          await eventually(async () => (await available(adm)) === 2, 10_000, 'back');
          return performance.now();
        }),
      );
      const spread = Math.max(...backAt) - Math.min(...backAt);
      assert.ok(spread < 600, `came back ${spread.toFixed(0)} ms apart`);
    },
    { env: TWO, upstream: refusingFirst(state) },
  );
});
