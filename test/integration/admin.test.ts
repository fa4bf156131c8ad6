// The admin listener (docs/operations.md): health, readiness and Prometheus metrics on
// their own port; the public port knows none of them.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { parseProm } from '../support/prom.ts';
import { startUpstream } from '../support/upstream.ts';
import { freePort } from '../../src/process/listen.ts';

const SERIES = [
  'keyward_requests_total',
  'keyward_request_duration_seconds',
  'keyward_upstream_ttfb_seconds',
  'keyward_upstream_errors_total',
  'keyward_auth_failures_total',
  'keyward_limited_total',
  'keyward_bytes_total',
  'keyward_requests_in_flight',
  'keyward_keys',
  'keyward_keystore_up',
  'keyward_keystore_reload_errors_total',
  'keyward_keystore_last_reload_timestamp_seconds',
  // prom-client's defaults
  'process_cpu_user_seconds_total',
  'process_resident_memory_bytes',
  'nodejs_eventloop_lag_p99_seconds',
];

function portOf(output: string, msg: string): number {
  const line = output.split('\n').find((l) => l.includes(`"msg":"${msg}"`));
  return (JSON.parse(line as string) as { port: number }).port;
}

test('healthz, readyz and metrics: every named series exists and moves with traffic; 503 while draining', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-admin-'));
  let release: () => void = () => undefined;
  const up = await startUpstream((req, res, rec) => {
    if (rec.url.startsWith('/v3/slow')) {
      release = () => res.end('late');
      return;
    }
    req.on('end', () => res.end('{"ok":true}'));
  });
  const env = {
    KEYWARD_PORT: '0',
    KEYWARD_ADMIN_PORT: '0',
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_SPEECH_URL: `http://127.0.0.1:${await freePort()}`,
    KEYWARD_SPEECH_KEY: 'k',
  };
  const all = JSON.parse((await runCli(['keys', 'create', '--name', 'all', '--json'], env)).stdout) as { token: string };
  const seoOnly = JSON.parse((await runCli(['keys', 'create', '--name', 'gone', '--json'], env)).stdout) as { token: string };
  const scoped = JSON.parse((await runCli(['keys', 'create', '--name', 'seo-only', '--routes', 'seo', '--json'], env)).stdout) as { token: string };
  assert.equal((await runCli(['keys', 'revoke', 'gone'], env)).code, 0);
  const serve = await startCli(['serve'], env, '"msg":"admin listening"');
  try {
    const admin = `http://127.0.0.1:${portOf(serve.output(), 'admin listening')}`;
    const base = `http://127.0.0.1:${portOf(serve.output(), 'keyward listening')}`;
    const health = await request(`${admin}/healthz`);
    assert.equal(health.status, 200);
    const ready = await request(`${admin}/readyz`);
    assert.equal(ready.status, 200);
    assert.deepEqual(ready.json(), { status: 'ready', ready: true, draining: false, keys: 2 });
    assert.equal((await request(`${admin}/nope`)).status, 404);
    // On the public port these are ordinary paths: a token is needed.
    for (const p of ['/healthz', '/readyz', '/metrics']) assert.equal((await request(`${base}${p}`)).status, 401, p);

    const before = parseProm((await request(`${admin}/metrics`)).body.toString());
    assert.match((await request(`${admin}/metrics`)).headers['content-type'] ?? '', /^text\/plain/);
    for (const name of SERIES) assert.ok(before.declared.has(name), `${name} is exposed`);
    assert.equal(before.sum('keyward_keystore_up'), 1);
    assert.equal(before.sum('keyward_keys', { state: 'active' }), 2);
    assert.equal(before.sum('keyward_keys', { state: 'revoked' }), 1);
    assert.ok(before.sum('keyward_keystore_last_reload_timestamp_seconds') > Date.now() / 1000 - 60);

    const ok = await request(`${base}/seo/v3/x`, { method: 'POST', body: 'hello', headers: { authorization: `Bearer ${all.token}` } });
    assert.equal(ok.status, 200);
    assert.equal((await request(`${base}/speech/v1/voices`, { headers: { authorization: `Bearer ${all.token}` } })).status, 502);
    assert.equal((await request(`${base}/seo/v3/x`)).status, 401);
    assert.equal((await request(`${base}/seo/v3/x`, { headers: { authorization: 'Bearer kw_nonsense' } })).status, 401);
    assert.equal((await request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${seoOnly.token}` } })).status, 401);
    assert.equal((await request(`${base}/speech/v1/voices`, { headers: { authorization: `Bearer ${scoped.token}` } })).status, 403);

    const after = parseProm((await request(`${admin}/metrics`)).body.toString());
    const delta = (name: string, labels?: Record<string, string>): number => after.sum(name, labels) - before.sum(name, labels);
    assert.equal(delta('keyward_requests_total', { route: 'seo', method: 'POST', code: '200' }), 1);
    assert.equal(delta('keyward_requests_total', { route: 'speech', method: 'GET', code: '502' }), 1);
    assert.equal(delta('keyward_requests_total', { route: 'none', code: '401' }), 3);
    assert.equal(delta('keyward_upstream_errors_total', { route: 'speech', reason: 'ECONNREFUSED' }), 1);
    assert.equal(delta('keyward_auth_failures_total', { reason: 'missing' }), 1);
    assert.equal(delta('keyward_auth_failures_total', { reason: 'malformed' }), 1);
    assert.equal(delta('keyward_auth_failures_total', { reason: 'revoked' }), 1);
    assert.equal(delta('keyward_limited_total', { route: 'speech', reason: 'scope' }), 1);
    assert.equal(delta('keyward_bytes_total', { route: 'seo', direction: 'in' }), 5);
    assert.equal(delta('keyward_bytes_total', { route: 'seo', direction: 'out' }), ok.body.length);
    assert.equal(delta('keyward_request_duration_seconds_count', { route: 'seo' }), 1);
    assert.equal(delta('keyward_upstream_ttfb_seconds_count', { route: 'seo' }), 1);
    assert.equal(
      after.sum('keyward_request_duration_seconds_bucket', { route: 'seo', le: '+Inf' }),
      after.sum('keyward_request_duration_seconds_count', { route: 'seo' }),
    );
    assert.equal(after.sum('keyward_keys', { state: 'revoked' }), 1);
    assert.equal(after.sum('keyward_requests_in_flight'), 0);
    assert.equal(
      after.samples.some((s) => 'key' in s.labels || 'keyId' in s.labels),
      false,
      'no per-key labels',
    );

    // In flight, then draining: readiness says so while the request finishes.
    const slow = request(`${base}/seo/v3/slow`, { headers: { authorization: `Bearer ${all.token}` } });
    await eventually(
      async () => parseProm((await request(`${admin}/metrics`)).body.toString()).sum('keyward_requests_in_flight', { route: 'seo' }) === 1,
      3_000,
      'in flight',
    );
    serve.child.kill('SIGTERM');
    await eventually(async () => (await request(`${admin}/readyz`)).status === 503, 3_000, 'not ready while draining');
    const draining = await request(`${admin}/readyz`);
    assert.deepEqual(draining.json(), { status: 'not ready', ready: false, draining: true, keys: 2, reason: 'draining' });
    assert.equal((await request(`${admin}/healthz`)).status, 200, 'alive while draining');
    release();
    assert.equal((await slow).status, 200);
    const result = await deadline(serve.done, 10_000, 'exit');
    assert.equal(result.code, 0);
  } finally {
    serve.child.kill('SIGKILL');
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('with KEYWARD_WORKERS=2 the admin listener in the primary reports the sum over workers', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-admin-w-'));
  const up = await startUpstream();
  const env = {
    KEYWARD_PORT: '0',
    KEYWARD_ADMIN_PORT: '0',
    KEYWARD_WORKERS: '2',
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
  };
  const key = JSON.parse((await runCli(['keys', 'create', '--name', 'w', '--json'], env)).stdout) as { token: string };
  const serve = await startCli(['serve'], env, '"msg":"admin listening"');
  try {
    await eventually(() => serve.output().split('"msg":"keyward listening"').length === 3, 10_000, 'two workers listening');
    const admin = `http://127.0.0.1:${portOf(serve.output(), 'admin listening')}`;
    const base = `http://127.0.0.1:${portOf(serve.output(), 'keyward listening')}`;
    await eventually(async () => (await request(`${admin}/readyz`)).status === 200, 5_000, 'ready');
    const replies = await Promise.all(Array.from({ length: 20 }, () => request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } })));
    for (const r of replies) assert.equal(r.status, 200);
    const m = parseProm((await request(`${admin}/metrics`)).body.toString());
    assert.equal(m.sum('keyward_requests_total', { route: 'seo', code: '200' }), 20);
    assert.equal(m.sum('keyward_keys', { state: 'active' }), 1, 'the same key set in every worker is not counted twice');
    assert.equal(m.sum('keyward_keystore_up'), 1);
  } finally {
    serve.child.kill('SIGTERM');
    await deadline(serve.done, 10_000, 'exit');
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
