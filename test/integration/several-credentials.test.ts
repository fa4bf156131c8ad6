// docs/credentials.md: several credentials on one route. A recording upstream
// answers per credential; the gateway chooses, sets aside on 401/402/429,
// sends a request again on another credential without the client seeing it,
// and answers 503 upstream_credentials_exhausted when none is left.
import assert from 'node:assert/strict';
import http from 'node:http';
import { test } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { ConfigError } from '../../src/config/options.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';
import { runCli } from '../support/cli.ts';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { startGateway, type TestGateway } from '../support/gateway.ts';
import { parseProm } from '../support/prom.ts';
import { startUpstream, type Handler, type MockUpstream } from '../support/upstream.ts';

const SPEECH = '/speech/v1/text-to-speech/voice1';

/** Three speech credentials with a tag of their own. */
function threeKeys(): { keys: string[]; env: Record<string, string> } {
  const tag = Math.random().toString(36).slice(2, 10);
  const keys = [1, 2, 3].map((n) => `sk_CRED${n}SECRET${tag}`);
  return { keys, env: { KEYWARD_SPEECH_KEY_2: keys[1] as string, KEYWARD_SPEECH_KEY_3: keys[2] as string } };
}

/** Which credential (1, 2, 3) an upstream request carried; 0 for none of them. */
const labelOf = (keys: readonly string[], headers: http.IncomingHttpHeaders): number => keys.indexOf(String(headers['xi-api-key'])) + 1;

/** Answers per credential: a status (with headers) for some, 200 with the body's length for the rest. */
function perCredential(keys: readonly string[], answers: Map<number, { status: number; headers?: Record<string, string>; body?: string }>): Handler {
  return (req, res, rec) => {
    req.on('end', () => {
      const label = labelOf(keys, req.headers);
      const a = answers.get(label);
      const body = a?.body ?? JSON.stringify({ credential: label, bytes: rec.body.length });
      res.writeHead(a?.status ?? 200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), ...a?.headers });
      res.end(body);
    });
  };
}

async function withThree(
  answers: Map<number, { status: number; headers?: Record<string, string>; body?: string }>,
  run: (gw: TestGateway, up: MockUpstream, keys: readonly string[]) => Promise<void>,
  env: Record<string, string> = {},
  options: Partial<Parameters<typeof startGateway>[0]> = {},
): Promise<void> {
  const { keys, env: extra } = threeKeys();
  const up = await startUpstream(perCredential(keys, answers));
  const gw = await startGateway({
    speech: up.url,
    secrets: { speech: [keys[0] as string] },
    env: { KEYWARD_CREDENTIAL_ORDER: 'first', ...extra, ...env },
    ...options,
  });
  try {
    await run(gw, up, keys);
  } finally {
    await gw.close();
    await up.close();
  }
}

const post = (gw: TestGateway, body = '{"text":"hello"}', headers: http.OutgoingHttpHeaders = {}) =>
  request(`${gw.url}${SPEECH}`, { method: 'POST', headers: { authorization: `Bearer ${gw.token}`, 'content-type': 'application/json', ...headers }, body });

test('configuration: numbered credentials; a gap, a login without its password and the same credential twice name the options, never a value', () => {
  const load = (env: Record<string, string>, files: Record<string, string> = {}) =>
    loadConfig(
      env,
      (p) => {
        const v = files[p];
        if (v === undefined) throw Object.assign(new Error('none'), { code: 'ENOENT' });
        return v;
      },
      '/',
      UPSTREAMS,
    );
  const ok = load(
    { KEYWARD_SPEECH_KEY: 'sk_one', KEYWARD_SPEECH_KEY_2: 'sk_two', KEYWARD_SPEECH_KEY_3_FILE: '/run/k3', CREDENTIALS_DIRECTORY: '/creds' },
    {
      '/run/k3': 'sk_three\n',
      '/creds/keyward_speech_key_4': 'sk_four',
    },
  );
  const speech = ok.routes.find((r) => r.name === 'speech');
  assert.deepEqual(
    speech?.credentials.map((c) => [c.label, c.header[1]]),
    [
      [1, 'sk_one'],
      [2, 'sk_two'],
      [3, 'sk_three'],
      [4, 'sk_four'],
    ],
  );
  assert.deepEqual(ok.unknownVariables, [], 'numbered names are known');
  // Every credential's forms reach the egress filter.
  assert.deepEqual(
    speech?.secretForms.map((f) => f.value),
    ['sk_one', 'sk_two', 'sk_three', 'sk_four'],
  );

  const problems = (env: Record<string, string>): string => {
    try {
      load(env);
    } catch (err) {
      assert.ok(err instanceof ConfigError);
      return err.message;
    }
    return assert.fail('accepted');
  };
  const gap = problems({ KEYWARD_SPEECH_KEY: 'sk_gap_one', KEYWARD_SPEECH_KEY_3: 'sk_gap_three' });
  assert.match(gap, /KEYWARD_SPEECH_KEY_3 is set but KEYWARD_SPEECH_KEY_2 is not/);
  assert.doesNotMatch(gap, /sk_gap/);
  const noFirst = problems({ KEYWARD_SCRAPER_TOKEN_2: 'apify_api_second' });
  assert.match(noFirst, /KEYWARD_SCRAPER_TOKEN_2 is set but KEYWARD_SCRAPER_TOKEN is not/);
  const half = problems({ KEYWARD_SEO_LOGIN: 'a@b.c', KEYWARD_SEO_PASSWORD: 'pw_one', KEYWARD_SEO_LOGIN_2: 'd@e.f' });
  assert.match(half, /KEYWARD_SEO_PASSWORD_2 must be set along with KEYWARD_SEO_LOGIN_2/);
  assert.doesNotMatch(half, /d@e\.f|pw_one/);
  const twice = problems({ KEYWARD_SPEECH_KEY: 'sk_twice', KEYWARD_SPEECH_KEY_2: 'sk_twice' });
  assert.match(twice, /KEYWARD_SPEECH_KEY_2 repeat KEYWARD_SPEECH_KEY: the same credential twice on route speech/);
  assert.doesNotMatch(twice, /sk_twice/);
  assert.match(problems({ KEYWARD_CREDENTIAL_ORDER: 'random' }), /KEYWARD_CREDENTIAL_ORDER/);
});

test('spread: the fewest in flight, ties in turn; first: the lowest-numbered available', async () => {
  await withThree(
    new Map(),
    async (gw, up, keys) => {
      for (let i = 0; i < 9; i++) assert.equal((await post(gw)).status, 200);
      const used = up.requests.map((r) => labelOf(keys, r.headers));
      assert.deepEqual(
        [1, 2, 3].map((l) => used.filter((u) => u === l).length),
        [3, 3, 3],
        `in turn: ${used.join(',')}`,
      );
    },
    { KEYWARD_CREDENTIAL_ORDER: 'spread' },
  );
  await withThree(new Map(), async (gw, up, keys) => {
    for (let i = 0; i < 4; i++) assert.equal((await post(gw)).status, 200);
    assert.deepEqual(
      up.requests.map((r) => labelOf(keys, r.headers)),
      [1, 1, 1, 1],
    );
  });
});

test('429 on one credential: set aside for its Retry-After, the request sent again byte for byte on the next, one request in the ledger', async () => {
  const answers = new Map([[1, { status: 429, headers: { 'retry-after': '2' }, body: '{"detail":"too_many_concurrent_requests"}' }]]);
  await withThree(answers, async (gw, up, keys) => {
    const body = JSON.stringify({ text: 'x'.repeat(5000) });
    const first = await post(gw, body, { expect: '100-continue' });
    assert.equal(first.status, 200);
    assert.deepEqual(JSON.parse(first.body.toString()), { credential: 2, bytes: Buffer.byteLength(body) });
    assert.equal(up.requests.length, 2);
    assert.deepEqual(
      up.requests.map((r) => labelOf(keys, r.headers)),
      [1, 2],
    );
    assert.deepEqual(up.requests[0]?.body, up.requests[1]?.body, 'the same body');
    assert.equal(up.requests[1]?.url, up.requests[0]?.url);
    assert.ok(!up.raw().includes(gw.token), 'the client token never reaches the upstream');
    // Credential 1 is aside: the next request goes to 2 at once.
    answers.delete(1);
    assert.equal((await post(gw)).status, 200);
    assert.equal(labelOf(keys, up.requests[2]?.headers ?? {}), 2);
    const line = gw.logs().find((l) => l.msg === 'request completed' && l.refusedBy !== null && l.refusedBy !== undefined);
    assert.equal(line?.refusedBy, '1:429');
    assert.equal(line?.credential, 2);
    const aside = gw.logs().find((l) => l.msg === 'upstream credential set aside');
    assert.equal(aside?.credential, 1);
    assert.equal(aside?.status, 429);
    const ready = gw.gateway.readiness();
    assert.deepEqual(ready.credentials, { speech: { available: 2, total: 3 } });
    const m = parseProm(await gw.gateway.metrics.text());
    assert.equal(m.sum('keyward_upstream_credential_set_aside_total', { route: 'speech', credential: '1', status: '429' }), 1);
    assert.equal(m.sum('keyward_upstream_retries_total', { route: 'speech', status: '429' }), 1);
    assert.equal(m.sum('keyward_upstream_credentials', { route: 'speech', state: 'set_aside' }), 1);
    // Back at the instant its Retry-After named.
    await eventually(() => gw.gateway.readiness().credentials?.speech?.available === 3, 5_000, 'credential 1 back');
    assert.equal((await post(gw)).status, 200);
    assert.equal(labelOf(keys, up.requests.at(-1)?.headers ?? {}), 1);
    await eventually(
      async () => (await gw.gateway.usagePage(new URLSearchParams())).length > 0 && (await usageRequests(gw)) === 3,
      5_000,
      'three requests of the key in the ledger, not four',
    );
    // Each account's answers: credential 1 refused once and answered once; credential 2 answered twice.
    const byCredential = await runCli(['usage', '--by', 'credential', '--json'], { KEYWARD_KEYS_FILE: gw.config.keysFile });
    assert.equal(byCredential.code, 0, byCredential.stderr);
    const rows = JSON.parse(byCredential.stdout) as Array<{ route: string; credential: number; requests: number; status: Record<string, number> }>;
    assert.deepEqual(
      rows.map((r) => [r.route, r.credential, r.requests, r.status['2xx'], r.status['4xx']]),
      [
        ['speech', 1, 2, 1, 1],
        ['speech', 2, 2, 2, 0],
      ],
    );
    const text = await runCli(['usage', '--by', 'credential'], { KEYWARD_KEYS_FILE: gw.config.keysFile });
    assert.match(text.stdout, /CREDENTIAL/);
    assert.ok(!text.stdout.includes(keys[1] as string), 'named by number, never by secret');
    const both = await runCli(['usage', '--by', 'credential', '--key', 'tester'], { KEYWARD_KEYS_FILE: gw.config.keysFile });
    assert.equal(both.code, 2);
  });
});

async function usageRequests(gw: TestGateway): Promise<number> {
  const r = await runCli(['usage', '--json'], { KEYWARD_KEYS_FILE: gw.config.keysFile });
  assert.equal(r.code, 0, r.stderr);
  return (JSON.parse(r.stdout) as Array<{ requests: number }>).reduce((n, row) => n + row.requests, 0);
}

test('402 and 401 set aside (401 until a reload, logged at error); every credential aside: 503 with Retry-After, nothing forwarded, no quota consumed', async () => {
  const answers = new Map([
    [1, { status: 401, body: '{"detail":{"status":"invalid_api_key","message":"Invalid API key"}}' }],
    [2, { status: 402, body: '{"detail":"quota_exceeded"}' }],
    [3, { status: 429, headers: { 'retry-after': new Date(Date.now() + 60_000).toUTCString() } }],
  ]);
  await withThree(
    answers,
    async (gw, up) => {
      // Each credential refused in turn: the third's answer is the client's, unchanged.
      const last = await post(gw);
      assert.equal(last.status, 429);
      assert.equal(up.requests.length, 3);
      const refused = await post(gw);
      assert.equal(refused.status, 503);
      assert.equal(JSON.parse(refused.body.toString()).code, 'upstream_credentials_exhausted');
      const wait = Number(refused.headers['retry-after']);
      assert.ok(wait >= 50 && wait <= 60, `Retry-After ${wait}: until the 429's date, the first to come back`);
      assert.equal(up.requests.length, 3, 'nothing forwarded');
      assert.deepEqual(gw.gateway.readiness().credentialsExhausted, ['speech']);
      assert.ok(gw.logs().some((l) => l.level === 50 && l.credential === 1 && l.status === 401));
      const status = await request(`${gw.url}/keyward/key`, { headers: { authorization: `Bearer ${gw.token}` } });
      const quota = JSON.parse(status.body.toString()).limits.find((l: { kind: string }) => l.kind === 'quota');
      assert.equal(quota.used, 1, 'the refused request consumed no quota unit');
      // A reload brings back the 401 only.
      answers.delete(1);
      gw.gateway.reconfigure(gw.config);
      assert.deepEqual(gw.gateway.readiness().credentials, { speech: { available: 1, total: 3 } });
      assert.equal((await post(gw)).status, 200);
    },
    {},
    { limits: { quota: '100/day' } },
  );
});

test('with one credential nothing changes: an upstream 429 goes to the client, and the next request is forwarded again', async () => {
  let n = 0;
  const up = await startUpstream((req, res) => {
    req.resume();
    req.on('end', () => {
      n++;
      res.writeHead(n === 1 ? 429 : 200, { 'retry-after': '30', 'content-length': 2 });
      res.end('{}');
    });
  });
  const gw = await startGateway({ speech: up.url });
  try {
    assert.equal((await post(gw)).status, 429);
    assert.equal((await post(gw)).status, 200);
    assert.equal(up.requests.length, 2);
    assert.equal(gw.gateway.readiness().credentials, undefined);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('bodies past KEYWARD_REPLAY_MAX_BODY are forwarded as they come and never sent again; a chunked body within it is, byte for byte', async () => {
  const answers = new Map([[1, { status: 429, headers: { 'retry-after': '1' } }]]);
  await withThree(
    answers,
    async (gw, up, keys) => {
      const big = 'y'.repeat(3000);
      const r = await post(gw, big);
      assert.equal(r.status, 429, 'the upstream answer, unchanged');
      assert.equal(up.requests.length, 1);
      await eventually(() => gw.gateway.readiness().credentials?.speech?.available === 3, 5_000, 'credential 1 back');
      // Chunked, within the limit.
      const chunked = await new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = http.request(
          `${gw.url}${SPEECH}`,
          { method: 'POST', headers: { authorization: `Bearer ${gw.token}`, 'transfer-encoding': 'chunked' } },
          (res) => {
            let body = '';
            res.on('data', (c: Buffer) => (body += c.toString()));
            res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
          },
        );
        req.on('error', reject);
        req.write('a'.repeat(500));
        setTimeout(() => req.end('b'.repeat(500)), 50);
      });
      assert.equal(chunked.status, 200);
      assert.equal(JSON.parse(chunked.body).credential, 2);
      const [a, b] = up.requests.slice(-2);
      assert.deepEqual([labelOf(keys, a?.headers ?? {}), labelOf(keys, b?.headers ?? {})], [1, 2]);
      assert.equal(b?.body.toString(), 'a'.repeat(500) + 'b'.repeat(500));
      assert.deepEqual(a?.body, b?.body);
    },
    { KEYWARD_REPLAY_MAX_BODY: '2KiB' },
  );
});

test('a client that leaves during the retry: the retried upstream request is cancelled at once', async () => {
  const { keys, env } = threeKeys();
  let retried: http.IncomingMessage | null = null;
  const up = await startUpstream((req, res) => {
    req.resume();
    req.on('end', () => {
      if (labelOf(keys, req.headers) === 1) {
        res.writeHead(429, { 'retry-after': '30', 'content-length': 2 });
        res.end('{}');
        return;
      }
      retried = req; // never answered
    });
  });
  const gw = await startGateway({ speech: up.url, secrets: { speech: [keys[0] as string] }, env: { ...env, KEYWARD_CREDENTIAL_ORDER: 'first' } });
  try {
    const req = http.request(`${gw.url}${SPEECH}`, { method: 'POST', headers: { authorization: `Bearer ${gw.token}`, 'content-length': 2 } });
    req.on('error', () => undefined);
    req.end('{}');
    await eventually(() => retried !== null, 5_000, 'the retry reached the upstream');
    req.destroy();
    await eventually(() => up.requests.at(-1)?.aborted === true, 3_000, 'the retried request cancelled upstream');
    await deadline(
      eventually(() => gw.logs().some((l) => l.msg === 'request completed' && l.aborted === true), 3_000, 'logged'),
      5_000,
      'log',
    );
  } finally {
    await gw.close();
    await up.close();
  }
});

test("egress: a response served on one credential is scrubbed of every credential's secret", async () => {
  const { keys, env } = threeKeys();
  const up = await startUpstream((req, res) => {
    req.resume();
    req.on('end', () => {
      const body = `echo ${keys.join(' ')} end`;
      res.writeHead(200, { 'content-type': 'text/plain', 'content-length': Buffer.byteLength(body), 'x-echo': keys[2] as string });
      res.end(body);
    });
  });
  const gw = await startGateway({ speech: up.url, secrets: { speech: [keys[0] as string] }, env });
  try {
    for (let i = 0; i < 3; i++) {
      const r = await post(gw);
      const all = r.body.toString() + JSON.stringify(r.headers);
      for (const k of keys) assert.ok(!all.includes(k), `credential ${k.slice(0, 8)} kept out`);
    }
    for (const k of keys) assert.ok(!gw.logText().includes(k), 'no secret in a log line');
  } finally {
    await gw.close();
    await up.close();
  }
});

test('attacks: an upload refused before it ended is never sent again; a refused answer carrying secrets never reaches the client; a key holder cannot make more than one try per credential', async () => {
  const { keys, env } = threeKeys();
  const up = await startUpstream((req, res) => {
    const label = labelOf(keys, req.headers);
    if (req.headers['x-early'] === '1' && label === 1) {
      // Refused at once, before the upload ended.
      const body = `slow down ${keys.join(' ')}`;
      res.writeHead(429, { 'retry-after': '30', 'content-length': Buffer.byteLength(body), 'x-leak': keys[0] as string });
      res.end(body);
      req.resume();
      return;
    }
    req.resume();
    req.on('end', () => {
      const body = label === 3 ? JSON.stringify({ credential: 3 }) : `refused ${keys.join(' ')}`;
      res.writeHead(label === 3 ? 200 : 429, { 'retry-after': '30', 'content-length': Buffer.byteLength(body), 'x-leak': keys[label - 1] ?? '' });
      res.end(body);
    });
  });
  const gw = await startGateway({ speech: up.url, secrets: { speech: [keys[0] as string] }, env: { ...env, KEYWARD_CREDENTIAL_ORDER: 'first' } });
  try {
    // Refused by 1 and 2 (their answers carry every secret), answered by 3: the client sees 3's answer only.
    const r = await post(gw);
    assert.equal(r.status, 200);
    assert.deepEqual(JSON.parse(r.body.toString()), { credential: 3 });
    assert.equal(up.requests.length, 3, 'one try per credential');
    for (const k of keys) assert.ok(!JSON.stringify(r.headers).includes(k));
    // Everything aside now: nothing more is forwarded, however often the key holder asks.
    for (let i = 0; i < 5; i++) assert.equal((await post(gw)).status, 200, 'credential 3 answers');
    assert.deepEqual(
      up.requests.slice(3).map((x) => labelOf(keys, x.headers)),
      [3, 3, 3, 3, 3],
      'the others stay aside: one upstream request per client request',
    );
    gw.gateway.reconfigure(gw.config); // 401s only come back: nothing changes for 429s
    assert.equal(gw.gateway.readiness().credentials?.speech?.available, 1);
  } finally {
    await gw.close();
    await up.close();
  }
  // An upload still streaming when credential 1 refused it: the answer goes to the client as it came, never retried.
  const up2 = await startUpstream((req, res) => {
    const label = labelOf(keys, req.headers);
    req.resume();
    if (label === 1) {
      res.writeHead(429, { 'retry-after': '30', 'content-length': 2 });
      res.end('{}');
      return;
    }
    req.on('end', () => {
      res.writeHead(200, { 'content-length': 2 });
      res.end('{}');
    });
  });
  const gw2 = await startGateway({ speech: up2.url, secrets: { speech: [keys[0] as string] }, env: { ...env, KEYWARD_CREDENTIAL_ORDER: 'first' } });
  try {
    const status = await new Promise<number>((resolve, reject) => {
      const req = http.request(
        `${gw2.url}${SPEECH}`,
        { method: 'POST', headers: { authorization: `Bearer ${gw2.token}`, 'transfer-encoding': 'chunked' } },
        (res) => {
          res.resume();
          resolve(res.statusCode ?? 0);
          req.destroy();
        },
      );
      req.on('error', reject);
      req.write('first part');
      // The rest never comes while the answer is awaited.
    });
    assert.equal(status, 429);
    await new Promise((r) => setTimeout(r, 200));
    assert.equal(up2.requests.length, 1, 'never sent again');
  } finally {
    await gw2.close();
    await up2.close();
  }
});
