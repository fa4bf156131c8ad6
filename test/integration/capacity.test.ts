// docs/credentials.md, "Capacity": requests held back in a fair queue instead
// of provoking the provider's 429s. A counting upstream answers 429 past its
// own limit per credential and records the most it ever had in flight.
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { randomBytes } from 'node:crypto';
import { test } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { ConfigError } from '../../src/config/options.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';
import { createKey } from '../../src/keys/manage.ts';
import type { Limits } from '../../src/keys/limits.ts';
import { request, type Reply } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { countingUpstream, type CountingUpstream } from '../support/counting-upstream.ts';
import { parseProm } from '../support/prom.ts';

const SPEECH = '/speech/v1/text-to-speech/voice1';

function speechKeys(n: number): string[] {
  const tag = randomBytes(5).toString('hex');
  return Array.from({ length: n }, (_, i) => `sk_CAP${i + 1}SECRET${tag}`);
}

interface Setup {
  gw: TestGateway;
  up: CountingUpstream;
  /** A second key's token (`burst`). */
  other: string;
}

async function withCapacity(
  o: { credentials: number; allow: number; holdMs: number | 'never'; env: Record<string, string>; limits?: Limits },
  run: (s: Setup) => Promise<void>,
): Promise<void> {
  const keys = speechKeys(o.credentials);
  const up = await countingUpstream({ secrets: keys, header: 'xi-api-key', allow: o.allow, holdMs: o.holdMs });
  let other = '';
  const extra: Record<string, string> = {};
  keys.slice(1).forEach((k, i) => (extra[`KEYWARD_SPEECH_KEY_${i + 2}`] = k));
  const gw = await startGateway({
    speech: up.url,
    secrets: { speech: [keys[0] as string] },
    env: { ...extra, ...o.env },
    ...(o.limits === undefined ? {} : { limits: o.limits }),
    prepare: async (store) => {
      other = (await createKey(store, 'burst')).token;
    },
  });
  try {
    await run({ gw, up, other });
  } finally {
    await gw.close();
    await up.close();
  }
}

const post = (gw: TestGateway, token: string, who: string, timeoutMs = 20_000): Promise<Reply> =>
  request(`${gw.url}${SPEECH}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json', 'x-who': who },
    body: '{"text":"hello"}',
    timeoutMs,
  });

const load = (env: Record<string, string>) => loadConfig({ KEYWARD_SPEECH_KEY: 'sk_one', KEYWARD_SPEECH_KEY_2: 'sk_two', ...env }, () => '', '/', UPSTREAMS);

function problems(env: Record<string, string>): readonly string[] {
  try {
    load(env);
  } catch (err) {
    assert.ok(err instanceof ConfigError);
    return err.problems;
  }
  return [];
}

test('configuration: every credential, one credential, the queue; bad values name their option; unset is no capacity at all', () => {
  const speech = (env: Record<string, string>) => load(env).routes.find((r) => r.name === 'speech');
  assert.equal(speech({})?.capacity, null);
  assert.equal(load({}).queueWaitMs, 10_000);
  assert.equal(load({}).queueMax, 1000);
  const both = speech({ KEYWARD_SPEECH_CONCURRENCY: '4', KEYWARD_SPEECH_CONCURRENCY_2: '15', KEYWARD_SPEECH_RATE_1: '600/m' });
  assert.deepEqual(
    both?.capacity?.map((c) => [c.concurrency, c.rate?.perSecond ?? null, c.rate?.burst ?? null]),
    [
      [4, 10, 10],
      [15, null, null],
    ],
  );
  // A rate below one a second still lets one request through: the burst is at least 1.
  assert.equal(speech({ KEYWARD_SPEECH_RATE: '30/h' })?.capacity?.[0]?.rate?.burst, 1);
  assert.equal(load({ KEYWARD_QUEUE_WAIT: '0' }).queueWaitMs, 0);
  assert.equal(load({ KEYWARD_QUEUE_WAIT: '5m', KEYWARD_QUEUE_MAX: '7' }).queueMax, 7);
  for (const [name, value] of [
    ['KEYWARD_SPEECH_CONCURRENCY', '0'],
    ['KEYWARD_SPEECH_CONCURRENCY', 'many'],
    ['KEYWARD_SPEECH_CONCURRENCY_2', '-1'],
    ['KEYWARD_SPEECH_RATE', '10'],
    ['KEYWARD_SPEECH_RATE', '0/s'],
    ['KEYWARD_SPEECH_RATE_2', '5/d'],
    ['KEYWARD_QUEUE_WAIT', '6m'],
    ['KEYWARD_QUEUE_WAIT', 'soon'],
    ['KEYWARD_QUEUE_MAX', '0'],
  ] as const) {
    const found = problems({ [name]: value });
    assert.equal(found.length, 1, `${name}=${value}: ${found.join('; ')}`);
    assert.ok(found[0]?.startsWith(name), found[0]);
    assert.ok(!found[0]?.includes('sk_one'));
  }
  // A credential the route does not have.
  assert.match(problems({ KEYWARD_SPEECH_CONCURRENCY_3: '2' })[0] ?? '', /KEYWARD_SPEECH_CONCURRENCY_3: route speech has 2 credentials/);
});

test('a burst of 40 on two accounts of concurrency 2: all answered 200, none 429, never more than 2 in flight on either', async () => {
  await withCapacity({ credentials: 2, allow: 2, holdMs: 100, env: { KEYWARD_SPEECH_CONCURRENCY: '2' } }, async ({ gw, up }) => {
    const replies = await Promise.all(Array.from({ length: 40 }, (_, i) => post(gw, gw.token, `a${i}`)));
    assert.deepEqual(
      replies.map((r) => r.status),
      replies.map(() => 200),
    );
    assert.equal(up.refusedForConcurrency(), 0);
    assert.ok((up.most.get(1) ?? 0) <= 2 && (up.most.get(2) ?? 0) <= 2, JSON.stringify([...up.most]));
    // Both accounts served (spread): the burst took 40 requests through 4 slots.
    assert.ok((up.most.get(1) ?? 0) === 2 && (up.most.get(2) ?? 0) === 2);
    const waited = gw.logs().filter((l) => l.msg === 'request completed' && typeof l.queuedMs === 'number');
    assert.ok(waited.length >= 30, `requests that waited: ${waited.length}`);
    const metrics = parseProm(await gw.gateway.metrics.text());
    assert.equal(metrics.sum('keyward_upstream_in_flight', { route: 'speech', credential: '1' }), 0);
    assert.equal(metrics.sum('keyward_upstream_queued', { route: 'speech' }), 0);
    assert.equal(metrics.sum('keyward_upstream_queue_wait_seconds_count', { route: 'speech' }), waited.length);
  });
});

test('without the option the same burst provokes the provider: the baseline the queue removes', async () => {
  await withCapacity({ credentials: 1, allow: 2, holdMs: 300, env: {} }, async ({ gw, up }) => {
    const replies = await Promise.all(Array.from({ length: 10 }, (_, i) => post(gw, gw.token, `a${i}`)));
    assert.ok(replies.some((r) => r.status === 429));
    assert.ok(up.refusedForConcurrency() > 0);
    assert.equal(gw.gateway.readiness().capacity, undefined);
  });
});

test("fair per key: one key's burst of 500 holds another key's single request back by at most two of its slots", async () => {
  await withCapacity(
    { credentials: 1, allow: 1, holdMs: 10, env: { KEYWARD_SPEECH_CONCURRENCY: '1', KEYWARD_QUEUE_WAIT: '60s' } },
    async ({ gw, up, other }) => {
      const burst = Array.from({ length: 500 }, (_, i) => post(gw, other, `burst${i}`, 60_000));
      await eventually(() => (gw.gateway.readiness().capacity?.speech?.queued ?? 0) >= 300, 20_000, 'the burst waiting');
      const single = await post(gw, gw.token, 'single');
      assert.equal(single.status, 200);
      const served = up.arrivals.find((a) => a.who === 'single');
      const waited = gw.logs().find((l) => l.msg === 'request completed' && l.keyName === 'tester')?.queuedMs;
      assert.ok(served !== undefined && typeof waited === 'number');
      // The burst's requests the upstream got while the single one waited in the queue.
      const enqueued = served.at - waited;
      const ahead = up.arrivals.filter((a) => a.who.startsWith('burst') && a.at > enqueued && a.at < served.at).length;
      assert.ok(ahead <= 2, `served after ${ahead} of the burst (waited ${waited} ms)`);
      console.log(`fairness: a single request behind a burst of 500 of another key waited ${waited} ms, behind ${ahead} of the burst`);
      const rest = await Promise.all(burst);
      assert.ok(rest.every((r) => r.status === 200));
      assert.equal(up.most.get(1), 1);
    },
  );
});

test('past KEYWARD_QUEUE_WAIT: 503 upstream_busy with Retry-After, nothing forwarded, nothing counted; the log line says how long it waited', async () => {
  await withCapacity({ credentials: 1, allow: 1, holdMs: 1_500, env: { KEYWARD_SPEECH_CONCURRENCY: '1', KEYWARD_QUEUE_WAIT: '200ms' } }, async ({ gw, up }) => {
    const first = post(gw, gw.token, 'first');
    first.catch(() => undefined);
    await eventually(() => up.arrivals.length === 1, 5_000, 'the first forwarded');
    const second = await post(gw, gw.token, 'second');
    assert.equal(second.status, 503);
    assert.equal((second.json() as { code: string }).code, 'upstream_busy');
    assert.ok(Number(second.headers['retry-after']) >= 1);
    assert.equal((await first).status, 200);
    assert.equal(up.arrivals.length, 1);
    const line = gw.logs().find((l) => l.msg === 'request completed' && l.status === 503);
    assert.ok(typeof line?.queuedMs === 'number' && line.queuedMs >= 150, JSON.stringify(line));
    assert.equal(line?.ttfbMs, null);
    const metrics = parseProm(await gw.gateway.metrics.text());
    assert.equal(metrics.sum('keyward_upstream_busy_total', { route: 'speech' }), 1);
  });
});

test('a full queue answers busy at once; KEYWARD_QUEUE_WAIT=0 never waits', async () => {
  await withCapacity({ credentials: 1, allow: 1, holdMs: 1_500, env: { KEYWARD_SPEECH_CONCURRENCY: '1', KEYWARD_QUEUE_MAX: '1' } }, async ({ gw, up }) => {
    const first = post(gw, gw.token, 'first');
    first.catch(() => undefined);
    await eventually(() => up.arrivals.length === 1, 5_000, 'the first forwarded');
    const second = post(gw, gw.token, 'second');
    await eventually(() => gw.gateway.readiness().capacity?.speech?.queued === 1, 5_000, 'the second waiting');
    const started = Date.now();
    const third = await post(gw, gw.token, 'third');
    assert.equal(third.status, 503);
    assert.ok(Date.now() - started < 1_000, 'answered at once, not after the 10 s wait');
    assert.deepEqual([(await first).status, (await second).status], [200, 200]);
    assert.deepEqual(
      up.arrivals.map((a) => a.who),
      ['first', 'second'],
    );
  });
  await withCapacity({ credentials: 1, allow: 1, holdMs: 400, env: { KEYWARD_SPEECH_CONCURRENCY: '1', KEYWARD_QUEUE_WAIT: '0' } }, async ({ gw, up }) => {
    const first = post(gw, gw.token, 'first');
    first.catch(() => undefined);
    await eventually(() => up.arrivals.length === 1, 5_000, 'the first forwarded');
    assert.equal((await post(gw, gw.token, 'second')).status, 503);
    assert.equal((await first).status, 200);
  });
});

test('a client that leaves while waiting is out of the queue at once: never forwarded, no room held', async () => {
  await withCapacity({ credentials: 1, allow: 1, holdMs: 300, env: { KEYWARD_SPEECH_CONCURRENCY: '1' } }, async ({ gw, up }) => {
    const first = post(gw, gw.token, 'first');
    first.catch(() => undefined);
    await eventually(() => up.arrivals.length === 1, 5_000, 'the first forwarded');
    const leaving = http.request(`${gw.url}${SPEECH}`, {
      method: 'POST',
      headers: { authorization: `Bearer ${gw.token}`, 'content-type': 'application/json', 'x-who': 'leaver', 'content-length': 2 },
    });
    leaving.on('error', () => undefined);
    leaving.end('{}');
    await eventually(() => gw.gateway.readiness().capacity?.speech?.queued === 1, 5_000, 'the leaver waiting');
    leaving.destroy();
    await eventually(() => gw.gateway.readiness().capacity?.speech?.queued === 0, 5_000, 'the leaver out of the queue');
    assert.equal((await first).status, 200);
    // Its room was never taken: the next request goes at once.
    assert.equal((await post(gw, gw.token, 'next')).status, 200);
    assert.deepEqual(
      up.arrivals.map((a) => a.who),
      ['first', 'next'],
    );
    assert.deepEqual(gw.gateway.readiness().capacity?.speech, { inFlight: 0, limit: 1, queued: 0 });
  });
});

test('an upstream that never answers holds its room only until the upstream timeout', async () => {
  await withCapacity(
    { credentials: 1, allow: 1, holdMs: 'never', env: { KEYWARD_SPEECH_CONCURRENCY: '1', KEYWARD_UPSTREAM_TIMEOUT: '300ms' } },
    async ({ gw, up }) => {
      const [a, b] = await Promise.all([post(gw, gw.token, 'a'), post(gw, gw.token, 'b')]);
      assert.deepEqual([a.status, b.status], [504, 504]);
      assert.equal(up.arrivals.length, 2);
      assert.equal(up.most.get(1), 1);
      assert.equal(gw.gateway.readiness().capacity?.speech?.inFlight, 0);
    },
  );
});

test('a waiting upload is not read: 100 Continue only once it has room', async () => {
  await withCapacity({ credentials: 1, allow: 1, holdMs: 400, env: { KEYWARD_SPEECH_CONCURRENCY: '1' } }, async ({ gw, up }) => {
    const first = post(gw, gw.token, 'first');
    first.catch(() => undefined);
    await eventually(() => up.arrivals.length === 1, 5_000, 'the first forwarded');
    const socket = net.connect(gw.port, '127.0.0.1');
    let received = '';
    socket.on('data', (c: Buffer) => (received += c.toString('latin1')));
    socket.write(
      `POST ${SPEECH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ${gw.token}\r\nContent-Type: application/json\r\nContent-Length: 2\r\nExpect: 100-continue\r\nx-who: upload\r\n\r\n`,
    );
    await eventually(() => gw.gateway.readiness().capacity?.speech?.queued === 1, 5_000, 'the upload waiting');
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(received, '', 'nothing said to a waiting upload');
    assert.equal((await first).status, 200);
    await eventually(() => received.includes('100 Continue'), 5_000, '100 Continue once it has room');
    socket.write('{}');
    await eventually(() => received.includes('HTTP/1.1 200'), 5_000, 'the upload answered');
    socket.destroy();
    assert.equal(up.most.get(1), 1);
  });
});

test('a 429 still sets its credential aside, and the request waits for room on another instead of failing', async () => {
  await withCapacity(
    { credentials: 2, allow: 1, holdMs: 150, env: { KEYWARD_SPEECH_CONCURRENCY: '1', KEYWARD_CREDENTIAL_ORDER: 'first' } },
    async ({ gw, up }) => {
      // The provider counts something the gateway cannot see on credential 1 (another client of that account): it refuses.
      up.now.set(1, 5);
      const replies = await Promise.all(Array.from({ length: 4 }, (_, i) => post(gw, gw.token, `r${i}`)));
      assert.deepEqual(
        replies.map((r) => r.status),
        [200, 200, 200, 200],
      );
      assert.ok((up.most.get(2) ?? 0) <= 1);
      const lines = gw.logs().filter((l) => l.msg === 'request completed');
      assert.ok(lines.some((l) => l.refusedBy === '1:429'));
      assert.ok(lines.every((l) => l.credential === 2));
    },
  );
});

test('a rate: at most a second of burst, then one request per token', async () => {
  await withCapacity({ credentials: 1, allow: 100, holdMs: 1, env: { KEYWARD_SPEECH_RATE: '5/s' } }, async ({ gw, up }) => {
    const replies = await deadline(Promise.all(Array.from({ length: 10 }, (_, i) => post(gw, gw.token, `r${i}`))), 10_000, 'ten requests at 5/s');
    assert.ok(replies.every((r) => r.status === 200));
    const times = up.arrivals.map((a) => a.at);
    // Five go at once (the burst); the other five need a token each, 200 ms apart.
    assert.ok((times[9] as number) - (times[0] as number) >= 900, `spread over ${(times[9] as number) - (times[0] as number)} ms`);
    assert.deepEqual(gw.gateway.readiness().capacity?.speech, { inFlight: 0, limit: null, queued: 0 });
  });
});

test("a key's own limits come first, and a request answered busy counts against none of them", async () => {
  await withCapacity(
    { credentials: 1, allow: 1, holdMs: 600, env: { KEYWARD_SPEECH_CONCURRENCY: '1', KEYWARD_QUEUE_WAIT: '150ms' }, limits: { quota: '2/day' } },
    async ({ gw, up }) => {
      const first = post(gw, gw.token, 'first');
      await eventually(() => up.arrivals.length === 1, 5_000, 'the first forwarded');
      assert.equal((await post(gw, gw.token, 'busy')).status, 503);
      assert.equal((await first).status, 200);
      // The busy one took no unit of the quota of 2: one more goes, then the quota is spent.
      assert.equal((await post(gw, gw.token, 'second')).status, 200);
      const spent = await post(gw, gw.token, 'third');
      assert.equal(spent.status, 429);
      assert.equal((spent.json() as { code: string }).code, 'quota_exceeded');
      assert.deepEqual(
        up.arrivals.map((a) => a.who),
        ['first', 'second'],
      );
    },
  );
});

test('a reload applies a new capacity to requests from then on; in flight is kept', async () => {
  await withCapacity({ credentials: 1, allow: 3, holdMs: 80, env: { KEYWARD_SPEECH_CONCURRENCY: '1' } }, async ({ gw, up }) => {
    await Promise.all(Array.from({ length: 6 }, (_, i) => post(gw, gw.token, `before${i}`)));
    assert.equal(up.most.get(1), 1);
    gw.gateway.reconfigure(loadConfig({ ...gw.env, KEYWARD_SPEECH_CONCURRENCY: '3' }, () => '', '/', UPSTREAMS));
    up.most.clear();
    await Promise.all(Array.from({ length: 12 }, (_, i) => post(gw, gw.token, `after${i}`)));
    assert.equal(up.most.get(1), 3);
    assert.equal(up.refusedForConcurrency(), 0);
    assert.deepEqual(gw.gateway.readiness().capacity?.speech, { inFlight: 0, limit: 3, queued: 0 });
  });
});

test("a request waiting for room counts against its key's concurrency", async () => {
  await withCapacity({ credentials: 1, allow: 1, holdMs: 500, env: { KEYWARD_SPEECH_CONCURRENCY: '1' }, limits: { concurrency: 2 } }, async ({ gw, up }) => {
    const first = post(gw, gw.token, 'first');
    await eventually(() => up.arrivals.length === 1, 5_000, 'the first forwarded');
    const second = post(gw, gw.token, 'second');
    await eventually(() => gw.gateway.readiness().capacity?.speech?.queued === 1, 5_000, 'the second waiting');
    const third = await post(gw, gw.token, 'third');
    assert.equal(third.status, 429);
    assert.equal((third.json() as { code: string }).code, 'concurrency_limited');
    assert.deepEqual([(await first).status, (await second).status], [200, 200]);
  });
});
