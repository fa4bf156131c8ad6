// Round 4 against the admin API (docs/admin-api.md), on a real `keyward
// serve` with its admin listener:
// - point 4: `POST /v1/keys/{id}/revoke?dryRun=true` answered 200 and
//   revoked; unknown or repeated query parameters were ignored on writes;
// - point 5: `GET /v1/keys/{id}` gave a quota in another shape than
//   `/keyward/key`, and figures read from the ledger's rows (`used 0` just
//   after three forwarded requests);
// - point 8: an externalId stayed bound to a revoked key; `budgets: {}`
//   changed nothing with a 200; `alertAt: null` stored no alerts instead of
//   the default; a PATCH that changed nothing wrote an audit entry; a
//   `text/plain` body was read as JSON.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli } from '../support/cli.ts';
import { startFleetGateway, statusOf } from '../support/fleet.ts';
import { eventually } from '../support/deadline.ts';
import { conforms, template } from '../support/openapi.ts';
import { startUpstream } from '../support/upstream.ts';
import { OPENAPI } from '../../src/admin/openapi.ts';

interface Answer {
  readonly status: number;
  readonly body: Record<string, unknown>;
}

test('admin API round 4: query parameters, the key view as /keyward/key gives it, externalId on revoke, empty and no-op changes, media types', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-admin-r4-'));
  const up = await startUpstream();
  const env = {
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    // Longer than the test: the ledger's rows are not what the figures come from.
    KEYWARD_USAGE_FLUSH: '60s',
  };
  const made = await runCli(['admins', 'create', '--name', 'ops', '--json'], env);
  assert.equal(made.code, 0, made.stderr);
  const ops = (JSON.parse(made.stdout) as { token: string }).token;
  const gw = await startFleetGateway(env);
  const admin = gw.admin as string;
  const api = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Answer> => {
    const payload = body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body);
    const r = await request(`${admin}${path}`, {
      method,
      headers: { authorization: `Bearer ${ops}`, ...(payload === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
      ...(payload === undefined ? {} : { body: payload }),
    });
    const parsed = JSON.parse(r.body.toString()) as Record<string, unknown>;
    conforms(method, template(path), r.status, parsed, 'application/json');
    return { status: r.status, body: parsed };
  };
  const auditCount = async (): Promise<number> => ((await api('GET', '/v1/audit?limit=1000')).body.entries as unknown[]).length;
  try {
    const key = await api('POST', '/v1/keys', { name: 'metered', quota: '3/day', budgets: { seo: '5/day' }, externalId: 'billing' });
    assert.equal(key.status, 201);
    const id = key.body.id as string;
    const token = key.body.token as string;

    // Point 4: every endpoint, every method: an unknown or a repeated query parameter is a 400, and nothing is done.
    for (const [method, path, body] of [
      ['POST', `/v1/keys/${id}/revoke?dryRun=true`, {}],
      ['POST', '/v1/keys?x=1', { name: 'never' }],
      ['PATCH', `/v1/keys/${id}?x=1`, { rate: '1/s' }],
      ['POST', `/v1/keys/${id}/rotate?x=1`, {}],
      ['GET', '/v1/openapi.json?x=1', undefined],
      ['GET', `/v1/keys/${id}?x=1`, undefined],
      ['GET', '/v1/keys?limit=1&limit=2', undefined],
      ['GET', '/v1/audit?since=7d&since=1d', undefined],
      ['GET', '/v1/usage?route=seo&route=seo', undefined],
    ] as const) {
      const r = await api(method, path, body);
      assert.equal(r.status, 400, `${method} ${path}`);
      assert.equal(r.body.code, 'bad_request');
      assert.match(String(r.body.field), /^(dryRun|x|limit|since|route)$/);
    }
    const still = await api('GET', `/v1/keys/${id}`);
    assert.equal(still.body.state, 'active', 'the dry run revoked nothing');
    assert.equal(still.body.limits && (still.body.limits as { rate?: string }).rate, undefined, 'the PATCH with ?x=1 changed nothing');
    assert.equal((await api('GET', '/v1/keys?name=never')).body.keys && ((await api('GET', '/v1/keys?name=never')).body.keys as unknown[]).length, 0);
    // The document lists the 400 on every operation.
    for (const [path, item] of Object.entries(OPENAPI.paths as Record<string, Record<string, { responses?: Record<string, unknown> }>>))
      for (const [method, op] of Object.entries(item))
        if (op.responses !== undefined) assert.ok('400' in op.responses, `${method.toUpperCase()} ${path} lists its 400`);

    await eventually(async () => (await statusOf(gw.base, token, '/keyward/key')) === 200, 5_000, 'the new key served');
    // Point 5: three requests forwarded, then the key view says what /keyward/key says, in its shape.
    for (let i = 0; i < 3; i++) assert.equal((await request(`${gw.base}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } })).status, 200);
    const own = JSON.parse((await request(`${gw.base}/keyward/key`, { headers: { authorization: `Bearer ${token}` } })).body.toString()) as {
      limits: Array<Record<string, unknown>>;
    };
    const view = await api('GET', `/v1/keys/${id}`);
    const use = view.body.use as Array<Record<string, unknown>>;
    assert.deepEqual(
      use,
      own.limits.filter((l) => l.kind === 'quota' || l.kind === 'budget'),
    );
    const quota = use.find((l) => l.kind === 'quota') as Record<string, unknown>;
    assert.equal(quota.value, 3);
    assert.equal(quota.unit, 'requests');
    assert.equal(quota.used, 3, 'the serving process’s count, before any flush');
    assert.equal(quota.remaining, 0);
    assert.match(String(quota.resetsAt), /T00:00:00Z$/);

    // Point 8: an empty budgets object is a 400 like an empty body; alertAt null is the default thresholds.
    const empty = await api('PATCH', `/v1/keys/${id}`, { budgets: {} });
    assert.equal(empty.status, 400);
    assert.equal(empty.body.field, 'budgets');
    assert.equal((await api('PATCH', `/v1/keys/${id}`, { alertAt: [50] })).status, 200);
    const reset = await api('PATCH', `/v1/keys/${id}`, { alertAt: null });
    assert.equal(reset.status, 200);
    assert.equal((reset.body.limits as { alerts?: unknown }).alerts, undefined, 'no alerts field: the defaults');
    // The gateway serves the change once it has read the keys file (within a second).
    const alertAt = async (): Promise<string> =>
      JSON.stringify(
        (JSON.parse((await request(`${gw.base}/keyward/key`, { headers: { authorization: `Bearer ${token}` } })).body.toString()) as { alertAt: number[] })
          .alertAt,
      );
    await eventually(async () => (await alertAt()) === '[80,100]', 5_000, 'the default thresholds in force');
    // A PATCH that changes nothing writes no audit entry.
    const before = await auditCount();
    assert.equal((await api('PATCH', `/v1/keys/${id}`, { routes: null })).status, 200);
    assert.equal((await api('PATCH', `/v1/keys/${id}`, { quota: '3/day' })).status, 200);
    assert.equal(await auditCount(), before, 'no key.update entry without a change');
    // A text/plain body is not read as JSON.
    const plain = await api('PATCH', `/v1/keys/${id}`, '{"rate":"1/s"}', { 'content-type': 'text/plain' });
    assert.equal(plain.status, 415);
    assert.equal(plain.body.code, 'unsupported_media_type');
    assert.equal(((await api('GET', `/v1/keys/${id}`)).body.limits as { rate?: string }).rate, undefined);
    // Revoking frees the externalId: the key that replaces it takes it.
    assert.equal((await api('POST', `/v1/keys/${id}/revoke`)).status, 200);
    const again = await api('POST', '/v1/keys', { name: 'metered-2', externalId: 'billing' });
    assert.equal(again.status, 201, JSON.stringify(again.body));
    assert.equal((await api('GET', '/v1/keys/ext:billing')).body.id, again.body.id);
    // A revoked key cannot be changed: 409 with its id, as the docs promise.
    const dead = await api('PATCH', `/v1/keys/${id}`, { externalId: null });
    assert.equal(dead.status, 409);
    assert.equal(dead.body.id, id);
  } finally {
    await gw.stop().catch(() => gw.kill());
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
