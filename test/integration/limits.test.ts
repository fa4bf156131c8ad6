// Per-key limits and the usage ledger (docs/limits.md), one gateway, over
// real sockets with the SQLite ledger beside the keys file.
import { once } from 'node:events';
import { join } from 'node:path';
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';
import { setTimeout as sleep } from 'node:timers/promises';
import { request } from '../support/client.ts';
import { runCli, startCli } from '../support/cli.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { parseProm } from '../support/prom.ts';
import { startUpstream } from '../support/upstream.ts';
import { MemoryUsageStore } from '../../src/ledger/memory-store.ts';
import type { UsageRow } from '../../src/ledger/store.ts';

const auth = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` });

test('a burst against a rate limit: the bucket passes, the rest get 429 rate_limited with Retry-After and RateLimit-*; nothing of them is forwarded', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, limits: { rate: '2/s', burst: 4 } });
  try {
    const replies = [];
    for (let i = 0; i < 8; i++) replies.push(await request(`${gw.url}/seo/v3/x${i}`, { headers: auth(gw.token) }));
    const statuses = replies.map((r) => r.status);
    assert.deepEqual(statuses.slice(0, 4), [200, 200, 200, 200]);
    const refused = replies.filter((r) => r.status === 429);
    assert.ok(refused.length >= 3, `refused: ${statuses.join(',')}`);
    for (const r of refused) {
      // The refusal explains itself: which limit, its value and window, when the next request may go (RFC 3339), consistent with Retry-After.
      const body = r.json() as {
        error: string;
        code: string;
        limit: { kind: string; value: number; unit: string; used: number; period: null; window: number; resetsAt: string };
      };
      assert.equal(body.code, 'rate_limited');
      assert.deepEqual(
        { ...body.limit, resetsAt: 'checked below' },
        { kind: 'rate', value: 2, unit: 'requests', used: 2, period: null, window: 1, resetsAt: 'checked below' },
      );
      assert.equal(body.error, `Rate limit of 2 requests per 1 s reached; the next request is allowed at ${body.limit.resetsAt}.`);
      const resetsIn = (Date.parse(body.limit.resetsAt) - Date.now()) / 1000;
      assert.ok(resetsIn > -1 && resetsIn <= Number(r.headers['retry-after']) + 1, `resets ${body.limit.resetsAt}, Retry-After ${r.headers['retry-after']}`);
      assert.ok(Number(r.headers['retry-after']) >= 1);
      // The key's rate per window, its burst in the policy (docs/limits.md, "Refusals").
      assert.equal(r.headers['ratelimit-limit'], '2');
      assert.equal(r.headers['ratelimit-policy'], '2;w=1;burst=4');
      assert.equal(r.headers['ratelimit-remaining'], '0');
      assert.ok(Number(r.headers['ratelimit-reset']) >= 1);
    }
    assert.equal(up.requests.length, 8 - refused.length, 'refused requests never reached the upstream');
    // Forwarded answers are the upstream's own: no limit headers added.
    assert.equal(replies[0]?.headers['ratelimit-limit'], undefined);
    // The bucket refills: a token within about half a second at 2/s.
    await eventually(async () => (await request(`${gw.url}/seo/v3/later`, { headers: auth(gw.token) })).status === 200, 3_000, 'refilled');
    const m = parseProm(await gw.gateway.metrics.text());
    assert.ok(m.sum('keyward_limited_total', { route: 'seo', reason: 'rate' }) >= refused.length);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a concurrency slot comes back when the client leaves mid-response', async () => {
  let held: http.ServerResponse | null = null;
  const up = await startUpstream((req, res) => {
    req.resume();
    if (req.url?.includes('slow') === true) {
      res.writeHead(200, { 'content-type': 'text/plain' });
      res.write('start');
      held = res;
      return;
    }
    res.writeHead(200, { 'content-length': 2 });
    res.end('ok');
  });
  const gw = await startGateway({ speech: up.url, limits: { concurrency: 1 } });
  try {
    const slow = http.get(`${gw.url}/speech/v1/slow`, { headers: auth(gw.token), agent: false });
    slow.on('error', () => undefined);
    await eventually(() => held !== null, 3_000, 'slow request in flight');
    const second = await request(`${gw.url}/speech/v1/x`, { headers: auth(gw.token) });
    assert.equal(second.status, 429);
    assert.deepEqual(second.json(), {
      error: 'Concurrency limit of 1 requests in flight reached; one may start when another finishes.',
      code: 'concurrency_limited',
      limit: { kind: 'concurrency', value: 1, unit: 'requests', used: 1, period: null, resetsAt: null },
    });
    assert.equal(second.headers['retry-after'], '1');
    slow.destroy(); // the client leaves
    await eventually(async () => (await request(`${gw.url}/speech/v1/x`, { headers: auth(gw.token) })).status === 200, 2_000, 'slot released');
  } finally {
    (held as http.ServerResponse | null)?.destroy();
    await gw.close();
    await up.close();
  }
});

test('budgets on both cost-reporting routes: the speech header and the SEO body (split byte by byte, nested task costs ignored)', async () => {
  const up = await startUpstream(async (req, res) => {
    req.resume();
    await once(req, 'end');
    if (req.url?.startsWith('/v1/') === true) {
      res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': '60', 'content-length': 3 });
      return void res.end('mp3');
    }
    const body = Buffer.from('{"version":"0.1","tasks":[{"cost":9,"result":[{"cost":7}]}],"status_code":20000,"cost":0.75,"x":"cost"}');
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': body.length });
    for (const byte of body) {
      res.write(Buffer.from([byte]));
      await sleep(0);
    }
    res.end();
  });
  const store = new MemoryUsageStore();
  const gw = await startGateway({ speech: up.url, seo: up.url, usageStore: store, limits: { budgets: { speech: '100/day', seo: '1/day' } } });
  try {
    const speech = async (): Promise<number> => (await request(`${gw.url}/speech/v1/tts`, { method: 'POST', headers: auth(gw.token), body: '{}' })).status;
    assert.equal(await speech(), 200); // 60 spent
    assert.equal(await speech(), 200); // 120 spent: this one was admitted at 60
    const third = await request(`${gw.url}/speech/v1/tts`, { method: 'POST', headers: auth(gw.token), body: '{}' });
    assert.equal(third.status, 429);
    const midnight = new Date(Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate() + 1)).toISOString().replace('.000Z', 'Z');
    // Which budget, on which route, what is spent (the ledger's 120), in the route's unit, and when it resets.
    assert.deepEqual(third.json(), {
      error: `Budget of 100 characters per day on speech used up (120 spent or reserved); it resets at ${midnight}.`,
      code: 'budget_exceeded',
      limit: { kind: 'budget', route: 'speech', value: 100, unit: 'characters', used: 120, period: 'day', resetsAt: midnight },
    });
    const untilMidnight = (Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate() + 1) - Date.now()) / 1000;
    assert.ok(Math.abs(Number(third.headers['retry-after']) - untilMidnight) < 5, 'Retry-After: until the period ends');
    // SEO: the top-level cost (0.75), not the tasks' (9, 7), whatever the chunking.
    assert.equal((await request(`${gw.url}/seo/v3/a`, { headers: auth(gw.token) })).status, 200);
    assert.equal((await request(`${gw.url}/seo/v3/b`, { headers: auth(gw.token) })).status, 200); // 0.75 < 1 when admitted
    assert.equal((await request(`${gw.url}/seo/v3/c`, { headers: auth(gw.token) })).status, 429); // 1.5 spent
    await gw.gateway.shutdown();
    const rows = await store.rows({});
    const sum = (route: string, f: keyof UsageRow): number => rows.filter((r) => r.route === route).reduce((a, r) => a + (r[f] as number), 0);
    assert.equal(sum('speech', 'cost'), 120);
    assert.equal(sum('seo', 'cost'), 1.5);
    assert.equal(sum('speech', 'requests'), 2);
    assert.equal(sum('speech', 'limited'), 1);
    assert.equal(sum('seo', 's2xx'), 2);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a 2 MiB answer whose cost is in its first KiB reaches the client before the upstream finishes', async () => {
  let finish: (() => void) | null = null;
  const up = await startUpstream((req, res) => {
    req.resume();
    res.writeHead(200, { 'content-type': 'application/json' });
    res.write(`{"cost":0.25,"tasks":[{"data":"${'x'.repeat(1024 * 1024)}`);
    finish = () => res.end(`${'y'.repeat(1024 * 1024)}"}]}`);
  });
  const gw = await startGateway({ seo: up.url });
  try {
    const first = await new Promise<number>((resolve, reject) => {
      const req = http.get(`${gw.url}/seo/v3/big`, { headers: auth(gw.token), agent: false }, (res) => {
        let got = 0;
        res.on('data', (c: Buffer) => {
          got += c.length;
          if (got >= 1024 * 1024) resolve(got);
        });
        res.on('end', () => undefined);
      });
      req.on('error', reject);
    });
    assert.ok(first >= 1024 * 1024, 'the first MiB arrived while the upstream had not finished');
    (finish as (() => void) | null)?.();
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a ledger write that fails is retried with its counts kept; none is lost or written twice, and /readyz stays ready', async () => {
  const up = await startUpstream();
  const written: UsageRow[] = [];
  let failures = 2;
  const flaky = {
    location: 'flaky',
    add: (rows: readonly UsageRow[]): Promise<void> => {
      if (failures-- > 0) return Promise.reject(new Error('disk full'));
      written.push(...rows.map((r) => ({ ...r })));
      return Promise.resolve();
    },
    rows: (): Promise<UsageRow[]> => Promise.resolve([]),
    close: (): Promise<void> => Promise.resolve(),
  };
  const gw = await startGateway({ seo: up.url, usageStore: flaky, env: { KEYWARD_USAGE_FLUSH: '100ms' } });
  try {
    for (let i = 0; i < 5; i++) assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: auth(gw.token) })).status, 200);
    await eventually(() => written.length > 0, 3_000, 'written after the failures');
    for (let i = 0; i < 3; i++) assert.equal((await request(`${gw.url}/seo/v3/y`, { headers: auth(gw.token) })).status, 200);
    assert.equal(gw.gateway.readiness().ready, true);
    await gw.gateway.shutdown();
    assert.equal(
      written.reduce((a, r) => a + r.requests, 0),
      8,
      'every request counted once',
    );
    const m = parseProm(await gw.gateway.metrics.text());
    assert.equal(m.sum('keyward_usage_flush_errors_total'), 2);
    assert.equal(gw.logs().filter((l) => l.msg === 'usage not written; kept and retried at every flush').length, 1, 'said once per outage');
    assert.equal(gw.logs().filter((l) => l.msg === 'usage written again').length, 1);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a spent quota stays spent across a restart; SIGTERM writes what was counted; keyward usage reports it', { timeout: 60_000 }, async () => {
  const up = await startUpstream();
  const { mkdtempSync, rmSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const dir = mkdtempSync(join(tmpdir(), 'keyward-quota-'));
  const env = {
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_PORT: '0',
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_USAGE_FLUSH: '1h',
  };
  try {
    const created = await runCli(['keys', 'create', '--name', 'q', '--quota', '3/day', '--json'], env);
    assert.equal(created.code, 0, created.stderr);
    const { token } = JSON.parse(created.stdout) as { token: string };
    const listed = JSON.parse((await runCli(['keys', 'list', '--json'], env)).stdout) as Array<{ limits?: unknown }>;
    assert.deepEqual(listed[0]?.limits, { quota: '3/day' });
    const serve = async (): Promise<{ base: string; stop: () => Promise<void> }> => {
      const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
      const port = (
        JSON.parse(
          gw
            .output()
            .split('\n')
            .find((l) => l.includes('keyward listening')) as string,
        ) as { port: number }
      ).port;
      return {
        base: `http://127.0.0.1:${port}`,
        stop: async () => {
          gw.child.kill('SIGTERM');
          await deadline(gw.done, 10_000, 'exit');
        },
      };
    };
    const first = await serve();
    const statuses: number[] = [];
    for (let i = 0; i < 4; i++) statuses.push((await request(`${first.base}/seo/v3/x`, { headers: auth(token) })).status);
    assert.deepEqual(statuses, [200, 200, 200, 429]);
    await first.stop(); // the flush interval is an hour: only the drain writes
    const second = await serve();
    const again = await request(`${second.base}/seo/v3/x`, { headers: auth(token) });
    assert.equal(again.status, 429);
    const refusal = again.json() as { code: string; error: string; limit: { kind: string; value: number; used: number; period: string; resetsAt: string } };
    assert.equal(refusal.code, 'quota_exceeded');
    // After a restart the count comes from the ledger the drain wrote: 3 of 3 used.
    assert.deepEqual(
      { kind: refusal.limit.kind, value: refusal.limit.value, used: refusal.limit.used, period: refusal.limit.period },
      { kind: 'quota', value: 3, used: 3, period: 'day' },
    );
    assert.equal(refusal.error, `Quota of 3 requests per day used up; it resets at ${refusal.limit.resetsAt}.`);
    await second.stop();
    const usage = await runCli(['usage', '--json'], env);
    assert.equal(usage.code, 0, usage.stderr);
    const rows = JSON.parse(usage.stdout) as Array<Record<string, unknown>>;
    assert.equal(rows.length, 1);
    const today = new Date().toISOString().slice(0, 10);
    assert.deepEqual(Object.keys(rows[0] as object), [
      'keyId',
      'key',
      'route',
      'day',
      'requests',
      'status',
      'limited',
      'bytesIn',
      'bytesOut',
      'cost',
      'costUnit',
      'pendingRuns',
    ]);
    assert.deepEqual(
      { ...rows[0], keyId: 'x', bytesOut: 0 },
      {
        keyId: 'x',
        key: 'q',
        route: 'seo',
        day: today,
        requests: 3,
        status: { '2xx': 3, '3xx': 0, '4xx': 0, '5xx': 0, other: 0 },
        limited: 2,
        bytesIn: 0,
        bytesOut: 0,
        cost: 0,
        costUnit: 'usd',
        pendingRuns: 0,
      },
    );
    // keys list says what is left of the period.
    const after = JSON.parse((await runCli(['keys', 'list', '--json'], env)).stdout) as Array<{ left?: unknown }>;
    assert.deepEqual(after[0]?.left, { quota: 0 });
    assert.match((await runCli(['keys', 'list'], env)).stdout, /LIMITS\n.*quota 3\/day \(0 left\)/s);
    const csv = (await runCli(['usage', '--csv', '--key', 'q'], env)).stdout.split('\n');
    assert.equal(csv[0], 'day,key,route,requests,2xx,3xx,4xx,5xx,other,limited,bytesIn,bytesOut,cost,costUnit,pendingRuns');
    assert.equal(csv.length, 4);
    assert.match(csv[2] as string, /^TOTAL,,,3,3,0,0,0,0,2,/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
    await up.close();
  }
});

test(
  'a crash loses at most one flush interval of the ledger; a cost that is not a number is counted as none and said once per route',
  { timeout: 60_000 },
  async () => {
    const up = await startUpstream((req, res) => {
      req.resume();
      res.writeHead(200, { 'content-type': 'audio/mpeg', 'character-cost': 'lots', 'content-length': 2 });
      res.end('ok');
    });
    const { mkdtempSync, rmSync } = await import('node:fs');
    const { tmpdir } = await import('node:os');
    const dir = mkdtempSync(join(tmpdir(), 'keyward-crash-'));
    const env = {
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      KEYWARD_PORT: '0',
      KEYWARD_SPEECH_URL: up.url,
      KEYWARD_SPEECH_KEY: 'speech-secret-value',
      KEYWARD_USAGE_FLUSH: '300ms',
    };
    try {
      const { token } = JSON.parse((await runCli(['keys', 'create', '--name', 'c', '--json'], env)).stdout) as { token: string };
      const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
      const port = (
        JSON.parse(
          gw
            .output()
            .split('\n')
            .find((l) => l.includes('keyward listening')) as string,
        ) as { port: number }
      ).port;
      for (let i = 0; i < 5; i++) assert.equal((await request(`http://127.0.0.1:${port}/speech/v1/x`, { headers: auth(token) })).status, 200);
      // Flushed: the ledger holds the first five (the drain never runs after SIGKILL).
      const ledger = async (): Promise<number> =>
        (JSON.parse((await runCli(['usage', '--json'], env)).stdout) as Array<{ requests: number }>).reduce((a, r) => a + r.requests, 0);
      await eventually(async () => (await ledger()) === 5, 10_000, 'the first five flushed');
      // The warning reaches the log (lines are written at least once a second) before the crash.
      await eventually(() => gw.output().includes('reported a cost that is not a number'), 5_000, 'the cost warning logged');
      for (let i = 0; i < 3; i++) assert.equal((await request(`http://127.0.0.1:${port}/speech/v1/y`, { headers: auth(token) })).status, 200);
      gw.child.kill('SIGKILL');
      await deadline(gw.done, 10_000, 'killed');
      const bad = gw
        .output()
        .split('\n')
        .filter((l) => l.includes('reported a cost that is not a number'));
      assert.equal(bad.length, 1, 'said once for the route');
      const rows = JSON.parse((await runCli(['usage', '--json'], env)).stdout) as Array<{ requests: number; cost: number }>;
      const counted = rows.reduce((a, r) => a + r.requests, 0);
      assert.ok(counted >= 5 && counted <= 8, `after a crash the ledger holds ${counted} of 8`);
      assert.equal(
        rows.reduce((a, r) => a + r.cost, 0),
        0,
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
      await up.close();
    }
  },
);
