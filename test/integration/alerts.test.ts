// Alerts before a quota or budget runs out (docs/limits.md, "Alerts"), to a
// real HTTP receiver started by each test: once per threshold and period,
// signed, across a restart, across three gateways on one PostgreSQL, after
// the receiver was down, and while it hangs.
import assert from 'node:assert/strict';
import { createHmac } from 'node:crypto';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli } from '../support/cli.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf } from '../support/fleet.ts';
import { startGateway } from '../support/gateway.ts';
import { startReceiver, type Received } from '../support/receiver.ts';
import { startDatabase } from '../support/postgres.ts';
import { parseProm } from '../support/prom.ts';
import { startUpstream } from '../support/upstream.ts';
import { freePort } from '../../src/process/listen.ts';

const SECRET = 'alert-signing-secret';

const signed = (r: Received): boolean => r.signature === `sha256=${createHmac('sha256', SECRET).update(r.body).digest('hex')}`;
const auth = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` });
const pending = (metrics: string): number => parseProm(metrics).sum('keyward_limit_alert_checks_pending', {});
/** No alert check is due on this gateway: whatever could fire has fired (and was counted). */
const settled = (gw: { gateway: { metrics: { text(): Promise<string> } } }): Promise<void> =>
  eventually(async () => pending(await gw.gateway.metrics.text()) === 0, 10_000, 'no alert check pending');
/** The same, read from a `keyward serve`'s admin listener. */
const settledAt = (admin: string | null): Promise<void> =>
  eventually(
    async () => {
      const r = await request(`${admin ?? ''}/metrics`);
      // A scrape that failed (a worker slow to answer the primary under load) says nothing yet: asked again.
      return r.status === 200 && pending(r.body.toString()) === 0;
    },
    20_000,
    'no alert check pending',
  );

test('a quota driven past 80 % and, after a restart, 100 %: exactly two signed alerts, a warn line and the metric each; none fired twice', async () => {
  const up = await startUpstream();
  const receiver = await startReceiver();
  const env = { KEYWARD_ALERT_WEBHOOK: receiver.url, KEYWARD_ALERT_WEBHOOK_SECRET: SECRET };
  const gw = await startGateway({ seo: up.url, env, limits: { quota: '10/day' } });
  let second: Awaited<ReturnType<typeof startGateway>> | null = null;
  try {
    // Nine overlapping requests: 80 % crossed, 100 % not yet.
    const statuses = await Promise.all(Array.from({ length: 9 }, () => request(`${gw.url}/seo/v3/x`, { headers: auth(gw.token) }).then((r) => r.status)));
    assert.deepEqual(statuses, Array(9).fill(200));
    await eventually(() => receiver.got.length >= 1, 10_000, 'the 80 % alert');
    await settled(gw); // no check is due: nothing more comes
    assert.deepEqual(
      receiver.got.map((r) => [r.json.event, r.json.limit.kind, r.json.limit.threshold, r.json.limit.value]),
      [['threshold_crossed', 'quota', 80, 10]],
    );
    // What was counted when the check ran: the 8th request crossed the line, the 9th may be in too.
    assert.ok([8, 9].includes(receiver.got[0]?.json.used as number), `used ${receiver.got[0]?.json.used}`);
    assert.equal(gw.logs().filter((l) => l.msg?.toString().startsWith('limit alert')).length, 1);
    const m = parseProm(await gw.gateway.metrics.text());
    assert.equal(m.sum('keyward_limit_alerts_total', { kind: 'quota', threshold: '80' }), 1);
    await gw.gateway.shutdown();

    // The same keys file and ledger, a new process: 80 % is recorded as fired, so the
    // next request (past 80 % still) fires 100 % alone. Then 20 overlapping: refused, nothing fires.
    second = await startGateway({ seo: up.url, env: { ...env, KEYWARD_KEYS_FILE: gw.config.keysFile }, limits: { quota: '10/day' }, keyName: 'second' });
    assert.equal((await request(`${second.url}/seo/v3/x`, { headers: auth(gw.token) })).status, 200);
    const more = await Promise.all(Array.from({ length: 20 }, () => request(`${second?.url}/seo/v3/x`, { headers: auth(gw.token) }).then((r) => r.status)));
    assert.deepEqual(more, Array(20).fill(429));
    await eventually(() => receiver.got.length >= 2, 10_000, 'the 100 % alert');
    await settled(second);
    assert.deepEqual(
      receiver.got.map((r) => [r.json.event, r.json.limit.threshold]),
      [
        ['threshold_crossed', 80],
        ['limit_reached', 100],
      ],
    );
    for (const r of receiver.got) {
      assert.ok(signed(r), 'HMAC-SHA256 of the body with the configured secret');
      assert.deepEqual(r.json.key, { id: gw.keyId, name: 'tester' });
      assert.ok(!r.body.includes(gw.token) && !r.body.includes(gw.secrets.seoPassword));
    }
    const warns = second.logs().filter((l) => l.msg?.toString().startsWith('limit alert'));
    assert.deepEqual(
      warns.map((l) => [l.level, l.threshold]),
      [[40, 100]],
    );
    // Another key crosses its own thresholds: its alerts are its own.
    for (let i = 0; i < 8; i++) assert.equal((await request(`${second.url}/seo/v3/x`, { headers: auth(second.token) })).status, 200);
    await eventually(() => receiver.got.length >= 3, 10_000, 'the other key at 80 %');
    await settled(second);
    assert.deepEqual(
      receiver.got.slice(2).map((r) => [r.json.key.id, r.json.limit.threshold]),
      [[second.keyId, 80]],
    );
  } finally {
    await second?.close();
    await gw.close();
    await receiver.close();
    await up.close();
  }
});

test('a receiver down for a while gets every alert once it is back; a hanging receiver holds no request', async () => {
  const up = await startUpstream((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': '25', 'content-length': 2 });
    res.end('ok');
  });
  const port = await freePort();
  const gw = await startGateway({
    speech: up.url,
    env: { KEYWARD_ALERT_WEBHOOK: `http://127.0.0.1:${port}/hooks/keyward`, KEYWARD_ALERT_WEBHOOK_SECRET: SECRET },
    limits: { budgets: { speech: '100/day' }, alerts: [50, 90, 100] },
  });
  let receiver: Awaited<ReturnType<typeof startReceiver>> | null = null;
  try {
    // 4 × 25 characters: 50 %, 90 % and 100 % crossed while nothing listens.
    for (let i = 0; i < 4; i++) assert.equal((await request(`${gw.url}/speech/v1/tts`, { method: 'POST', headers: auth(gw.token), body: '{}' })).status, 200);
    await eventually(() => gw.logs().some((l) => l.msg === 'alert webhook: not delivered; retrying'), 10_000, 'a failed attempt');
    receiver = await startReceiver(port);
    await eventually(() => receiver !== null && receiver.got.length >= 3, 30_000, 'every alert after the receiver came back');
    assert.deepEqual(
      receiver.got.map((r) => [r.json.limit.kind, r.json.limit.threshold, r.json.limit.unit]),
      [
        ['budget', 50, 'characters'],
        ['budget', 90, 'characters'],
        ['budget', 100, 'characters'],
      ],
    );
    assert.ok(receiver.got.every(signed));
  } finally {
    await gw.close();
    await receiver?.close();
    await up.close();
  }

  // A receiver that takes every POST and never answers.
  const hanging = await startReceiver(0, true);
  const up2 = await startUpstream();
  const gw2 = await startGateway({ seo: up2.url, env: { KEYWARD_ALERT_WEBHOOK: hanging.url }, limits: { quota: '100/day', alerts: [20, 50, 80, 100] } });
  try {
    // 19 requests below the first threshold (no alert yet), then 30 while the first alert's POST hangs: the same key, gateway and run.
    const timed = async (n: number, what: string): Promise<number[]> => {
      const ms: number[] = [];
      for (let i = 0; i < n; i++) {
        const at = performance.now();
        const r = await deadline(request(`${gw2.url}/seo/v3/x`, { headers: auth(gw2.token) }), 5_000, what);
        ms.push(performance.now() - at);
        assert.equal(r.status, 200);
      }
      return ms.sort((x, y) => x - y);
    };
    const before = await timed(19, 'a request before any alert');
    assert.equal(hanging.got.length, 0, 'no threshold crossed yet');
    assert.equal((await request(`${gw2.url}/seo/v3/x`, { headers: auth(gw2.token) })).status, 200);
    await eventually(() => hanging.got.length > 0, 10_000, 'the first alert sent');
    const during = await timed(30, 'a request while the receiver hangs');
    console.log(
      `requests before any alert: median ${before[9]?.toFixed(1)} ms, max ${before[18]?.toFixed(1)} ms; while the alert receiver hung: median ${during[15]?.toFixed(1)} ms, max ${during[29]?.toFixed(1)} ms`,
    );
    assert.equal(hanging.got.length, 1, 'one delivery at a time: the first still waits for its answer');
  } finally {
    await gw2.close();
    await hanging.close();
    await up2.close();
  }
});

test("three gateways on one PostgreSQL: one alert per threshold for the fleet; the key's status the same on each", { timeout: 180_000 }, async () => {
  const db = await startDatabase();
  const up = await startUpstream();
  const receiver = await startReceiver();
  const dir = mkdtempSync(join(tmpdir(), 'keyward-alerts-'));
  const env = {
    KEYWARD_DATABASE_URL: db.url,
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_USAGE_FLUSH: '300ms',
    KEYWARD_ALERT_WEBHOOK: receiver.url,
    KEYWARD_ALERT_WEBHOOK_SECRET: SECRET,
    KEYWARD_KEYS_FILE: join(dir, 'unused.json'),
  };
  const gateways: Array<Awaited<ReturnType<typeof startFleetGateway>>> = [];
  try {
    const created = await runCli(['keys', 'create', '--name', 'fleet-alerts', '--quota', '30/day', '--alert-at', '50%,80%,100%', '--json'], env);
    assert.equal(created.code, 0, created.stderr);
    const token = (JSON.parse(created.stdout) as { token: string }).token;
    for (let i = 0; i < 3; i++) gateways.push(await startFleetGateway(env));
    // Each gateway takes its part, overlapping: the fleet forwards exactly the quota.
    const ok = await Promise.all(
      gateways.map(async (g) => {
        let n = 0;
        for (let i = 0; i < 15; i++) if ((await statusOf(g.base, token)) === 200) n++;
        return n;
      }),
    );
    assert.equal(
      ok.reduce((a, b) => a + b, 0),
      30,
    );
    await eventually(() => receiver.got.length >= 3, 20_000, 'the fleet crossed every threshold');
    // No gateway has a check due any more (a key is checked for a few flushes after its last request): none fires one again.
    for (const g of gateways) await settledAt(g.admin);
    assert.deepEqual(
      receiver.got.map((r) => r.json.limit.threshold).sort((a, b) => a - b),
      [50, 80, 100],
    );
    assert.ok(receiver.got.every(signed));
    const [rows] = await db.admin<Array<{ n: number }>>`select count(*)::int as n from keyward_alerts where delivered`;
    assert.equal(rows?.n, 3);
    // The key's own status on each gateway: the fleet's written counts, the same everywhere.
    for (const g of gateways) {
      const r = await request(`${g.base}/keyward/key`, { headers: auth(token) });
      const body = r.json() as {
        limits: Array<{ kind: string; used: number; remaining: number }>;
        usage: { today: { routes: Record<string, { requests: number }> } };
      };
      assert.deepEqual(
        body.limits.map((l) => [l.kind, l.used, l.remaining]),
        [['quota', 30, 0]],
      );
      assert.equal(body.usage.today.routes.seo?.requests, 30);
    }
  } finally {
    await Promise.all(gateways.map((g) => g.stop().catch(() => g.kill())));
    await receiver.close();
    await up.close();
    await db.close();
  }
});

test('alerts not delivered before a stop are sent by the next start; with two workers the primary fires each once', { timeout: 120_000 }, async () => {
  const up = await startUpstream();
  const port = await freePort();
  const dir = mkdtempSync(join(tmpdir(), 'keyward-alerts-'));
  const env = {
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_USAGE_FLUSH: '200ms',
    KEYWARD_ALERT_WEBHOOK: `http://127.0.0.1:${port}/hooks/keyward`,
    KEYWARD_ALERT_WEBHOOK_SECRET: SECRET,
    KEYWARD_WORKERS: '2',
  };
  const created = await runCli(['keys', 'create', '--name', 'workers', '--quota', '10/day', '--json'], env);
  assert.equal(created.code, 0, created.stderr);
  const token = (JSON.parse(created.stdout) as { token: string }).token;
  let receiver: Awaited<ReturnType<typeof startReceiver>> | null = null;
  let gw = await startFleetGateway(env);
  try {
    // Over new connections, so both workers serve; nothing listens for the webhook yet.
    const statuses = await Promise.all(
      Array.from({ length: 14 }, () => request(`${gw.base}/seo/v3/x`, { headers: { ...auth(token), connection: 'close' } }).then((r) => r.status)),
    );
    assert.equal(statuses.filter((s) => s === 200).length, 10);
    await eventually(() => gw.output().includes('alert webhook: not delivered; retrying'), 10_000, 'a failed delivery');
    // The workers' counts reach the primary at their flushes, so the 100 %
    // line may be crossed a flush after the 80 % one failed to deliver.
    const fired = async (): Promise<string> => (await request(`${gw.admin as string}/metrics`)).body.toString();
    await eventually(async () => /keyward_limit_alerts_total\{kind="quota",threshold="100"\}/.test(await fired()), 10_000, 'the 100 % alert fired');
    await settledAt(gw.admin);
    const m = await fired();
    assert.match(m, /keyward_limit_alerts_total\{kind="quota",threshold="80"\} 1\n/);
    assert.match(m, /keyward_limit_alerts_total\{kind="quota",threshold="100"\} 1\n/);
    assert.equal((await gw.stop()).code, 0);
    // The receiver is up now; a new start sends what the last one could not.
    receiver = await startReceiver(port);
    gw = await startFleetGateway(env);
    await eventually(() => receiver !== null && receiver.got.length >= 2, 15_000, 'the undelivered alerts');
    // The start's one look for undelivered alerts is over (it says so after handing them all to the webhook) and no check is due.
    await eventually(() => /alerts not delivered before the last stop; sending them/.test(gw.output()), 10_000, 'the resend');
    await settledAt(gw.admin);
    assert.deepEqual(
      receiver.got.map((r) => [r.json.event, r.json.limit.threshold]),
      [
        ['threshold_crossed', 80],
        ['limit_reached', 100],
      ],
    );
    assert.ok(receiver.got.every(signed));
    assert.match(gw.output(), /alerts not delivered before the last stop; sending them/);
  } finally {
    await gw.stop().catch(() => gw.kill());
    await receiver?.close();
    await up.close();
  }
});
