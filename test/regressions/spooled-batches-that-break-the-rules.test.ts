// A kept-usage batch (keys.json.usage-unwritten.*.json) with a day of
// 9999-99-99 or a count of 1e300 failed at the store for ever, and every
// later batch of that gateway waited behind it; negative figures and
// unknown keys or routes were written as they were (a status then showed
// used: -1e+300). Batches are now checked by the stores' rules when read:
// one that fails is set aside beside the file, logged and counted, and the
// rest are written (docs/fleet.md, "Usage during an outage").
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli } from '../support/cli.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf } from '../support/fleet.ts';
import { startUpstream } from '../support/upstream.ts';
import { usageRow } from '../support/rows.ts';

test("spooled batches that break the ledger's rules are set aside with why; the others and every later count are written", { timeout: 90_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-spool-rules-'));
  const up = await startUpstream();
  const keysFile = join(dir, 'keys.json');
  const env = { KEYWARD_KEYS_FILE: keysFile, KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p', KEYWARD_USAGE_FLUSH: '200ms' };
  try {
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'kept', '--json'], env)).stdout) as { id: string; token: string };
    const today = new Date().toISOString().slice(0, 10);
    const row = (over: Record<string, unknown>): Record<string, unknown> => ({ ...usageRow({ keyId: key.id, day: today }), ...over });
    const batches = [
      { gateway: 'old', seq: 1, rows: [row({ day: '9999-99-99' })] },
      { gateway: 'old', seq: 2, rows: [row({ requests: 1e300 })] },
      { gateway: 'old', seq: 3, rows: [row({ requests: -1000, cost: -1e300 })] },
      { gateway: 'old', seq: 4, rows: [row({ route: 'nowhere' })] },
      { gateway: 'old', seq: 5, rows: [row({ keyId: 'key_nobody' })] },
      { gateway: 'old', seq: 6, rows: [row({ requests: 7, s2xx: 7 })] },
    ];
    const spool = `${keysFile}.usage-unwritten.old.json`;
    writeFileSync(spool, JSON.stringify({ batches }), { mode: 0o600 });
    const g = await startFleetGateway(env);
    try {
      for (let i = 0; i < 5; i++) assert.equal(await statusOf(g.base, key.token), 200);
      const total = async (): Promise<number> =>
        (JSON.parse((await runCli(['usage', '--json'], env)).stdout) as Array<{ requests: number }>).reduce((n, r) => n + r.requests, 0);
      await eventually(async () => (await total()) === 7 + 5, 10_000, 'the good batch and the 5 new requests written');
      assert.equal(existsSync(spool), false, 'the kept file is done with');
      const aside = JSON.parse(readFileSync(`${spool}.set-aside`, 'utf8')) as { setAside: Array<{ reason: string }> };
      assert.deepEqual(
        aside.setAside.map((a) => a.reason),
        [
          'day 9999-99-99 does not exist',
          'requests 1e+300 is not a whole number from 0 to 2^53',
          'requests -1000 is not a whole number from 0 to 2^53',
          "route nowhere is not one of this gateway's",
          'key key_nobody is not in the key set',
        ],
      );
      assert.match(g.output(), /"msg":"kept usage that breaks the ledger's rules set aside, not written"/);
      assert.match((await request(`${g.admin as string}/metrics`)).body.toString(), /^keyward_usage_set_aside_total 5$/m);
      const status = (await request(`${g.base}/keyward/key`, { headers: { authorization: `Bearer ${key.token}` } })).json() as {
        usage: { today: { routes: { seo: { requests: number; cost: number } } } };
      };
      assert.deepEqual(status.usage.today.routes.seo, { requests: 12, cost: 0, unit: 'usd' });
    } finally {
      await g.stop().catch(() => g.kill());
    }
  } finally {
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
