// docs/admin-api.md: the admin API on a real `keyward serve`, over real
// sockets, on the keys file (with its SQLite audit log) and on PostgreSQL with
// two gateways. Every JSON answer is held to the OpenAPI document the API
// serves (test/support/openapi.ts); a test at the end checks that every
// endpoint was answered at least once with each of its success statuses.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli } from '../support/cli.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf, withFleet, type FleetGateway } from '../support/fleet.ts';
import { conforms, documented, template } from '../support/openapi.ts';
import { startUpstream } from '../support/upstream.ts';
import type { AuditEntry } from '../../src/keys/audit.ts';
import { isLoopbackHost } from '../../src/process/admin.ts';

/** Every `METHOD /path status` answered in this file, for the coverage check at the end. */
const answered = new Set<string>();

interface Answer {
  readonly status: number;
  readonly body: Record<string, unknown>;
  readonly text: string;
  readonly headers: Record<string, string | string[] | undefined>;
}

/** One admin API request; its answer checked against the OpenAPI document. */
async function api(
  base: string,
  method: string,
  path: string,
  options: { token?: string | null; body?: unknown; raw?: string; headers?: Record<string, string> } = {},
): Promise<Answer> {
  const headers: Record<string, string> = { ...options.headers };
  if (options.token !== undefined && options.token !== null) headers.authorization = `Bearer ${options.token}`;
  const payload = options.raw ?? (options.body === undefined ? undefined : JSON.stringify(options.body));
  if (payload !== undefined) headers['content-type'] = 'application/json';
  const r = await request(`${base}${path}`, { method, headers, ...(payload === undefined ? {} : { body: payload }) });
  const text = r.body.toString('utf8');
  const csv = String(r.headers['content-type'] ?? '').startsWith('text/csv');
  const body = csv ? {} : (JSON.parse(text) as Record<string, unknown>);
  answered.add(conforms(method, template(path), r.status, csv ? text : body, csv ? 'text/csv' : 'application/json'));
  return { status: r.status, body, text, headers: r.headers };
}

/** `keyward admins create` through the CLI: the token. */
async function adminToken(env: Record<string, string>, name: string, role = 'write'): Promise<string> {
  const r = await runCli(['admins', 'create', '--name', name, '--role', role, '--json'], env, undefined, 60_000);
  assert.equal(r.code, 0, r.stderr);
  const made = JSON.parse(r.stdout) as { token: string; role: string; digest?: unknown };
  assert.equal(made.role, role);
  assert.equal(made.digest, undefined, 'an admin token is shown, its digest never');
  assert.match(made.token, /^kwa_[0-9A-Za-z]{49}$/);
  return made.token;
}

/** A single `keyward serve` on a keys file in a new folder, with the seo route to a recording upstream. */
async function onKeysFile(run: (gw: FleetGateway, env: Record<string, string>, upstream: string) => Promise<void>, extra: Record<string, string> = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-admin-api-'));
  const up = await startUpstream();
  const env = {
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SEO_URL: up.url,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
    KEYWARD_USAGE_FLUSH: '200ms',
    ...extra,
  };
  let gw: FleetGateway | null = null;
  try {
    gw = await startFleetGateway(env);
    await run(gw, env, up.url);
  } finally {
    await gw?.stop().catch(() => gw?.kill());
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
}

test('keys file: create over HTTP, the token works on the public port at once; read, list in pages, change, rotate, revoke; usage and audit', async () => {
  await onKeysFile(async (gw, env) => {
    const admin = gw.admin as string;
    const ops = await adminToken(env, 'ops');
    const viewer = await adminToken(env, 'viewer', 'read');

    // Create: the CLI's values, the token once, never a digest.
    const made = await api(admin, 'POST', '/v1/keys', {
      token: ops,
      body: {
        name: 'billing',
        routes: ['seo'],
        rate: '50/s',
        burst: 10,
        quota: '1000/day',
        budgets: { seo: '5/day' },
        alertAt: [50, 90],
        externalId: 'tf-billing',
      },
    });
    assert.equal(made.status, 201, made.text);
    const key = made.body as { id: string; token: string; limits: Record<string, unknown> };
    assert.match(key.token, /^kw_/);
    assert.deepEqual(key.limits, { rate: '50/s', burst: 10, quota: '1000/day', budgets: { seo: '5/day' }, alerts: [50, 90] });
    assert.ok(!made.text.includes('sha256:'));
    const madeAt = Date.now();
    await eventually(async () => (await statusOf(gw.base, key.token)) === 200, 1_000, 'the new key served within a second');
    assert.ok(Date.now() - madeAt <= 1_500);

    // The same externalId again: 409 naming the key that has it.
    const twice = await api(admin, 'POST', '/v1/keys', { token: ops, body: { name: 'other', externalId: 'tf-billing' } });
    assert.equal(twice.status, 409);
    assert.equal(twice.body.id, key.id);
    // An active key's name again: 409 too.
    assert.equal((await api(admin, 'POST', '/v1/keys', { token: ops, body: { name: 'billing' } })).status, 409);

    // Read by id and by ext:, with where its quota and budget stand.
    const read = await api(admin, 'GET', `/v1/keys/${key.id}`, { token: viewer });
    assert.equal(read.status, 200);
    const byExt = await api(admin, 'GET', '/v1/keys/ext:tf-billing', { token: viewer });
    assert.deepEqual([byExt.body.id, byExt.body.externalId], [key.id, 'tf-billing']);
    const use = read.body.use as Array<{ kind: string; used: number; remaining: number; period: string }>;
    assert.deepEqual(
      use.map((u) => [u.kind, u.period]),
      [
        ['quota', 'day'],
        ['budget', 'day'],
      ],
    );
    assert.equal((await api(admin, 'GET', '/v1/keys/key_nothere', { token: viewer })).status, 404);
    // A name is no address here: names are reused.
    assert.equal((await api(admin, 'GET', '/v1/keys/billing', { token: viewer })).status, 404);

    // Pages: stable order, each key once.
    for (let i = 0; i < 5; i++) assert.equal((await api(admin, 'POST', '/v1/keys', { token: ops, body: { name: `batch-${i}` } })).status, 201);
    const seen: string[] = [];
    let cursor: string | null = null;
    for (let pages = 0; pages < 10; pages++) {
      const page: Answer = await api(admin, 'GET', `/v1/keys?limit=2${cursor === null ? '' : `&cursor=${cursor}`}`, { token: viewer });
      assert.equal(page.status, 200);
      const keys = page.body.keys as Array<{ id: string }>;
      assert.ok(keys.length <= 2);
      seen.push(...keys.map((k) => k.id));
      cursor = page.body.next as string | null;
      if (cursor === null) break;
    }
    assert.equal(seen.length, 6);
    assert.equal(new Set(seen).size, 6);
    assert.equal(seen[0], key.id);
    const byName = await api(admin, 'GET', '/v1/keys?name=batch-3', { token: viewer });
    assert.deepEqual(
      (byName.body.keys as Array<{ name: string }>).map((k) => k.name),
      ['batch-3'],
    );
    assert.equal((await api(admin, 'GET', '/v1/keys?cursor=key_gone', { token: viewer })).body.field, 'cursor');

    // Change: a limit set, one removed (null), the token unchanged.
    const changed = await api(admin, 'PATCH', `/v1/keys/${key.id}`, { token: ops, body: { rate: '5/s', quota: null, allowFrom: ['127.0.0.0/8'] } });
    assert.equal(changed.status, 200, changed.text);
    assert.deepEqual(changed.body.limits, { rate: '5/s', burst: 10, budgets: { seo: '5/day' }, alerts: [50, 90], allowFrom: ['127.0.0.0/8'] });
    assert.equal((await api(admin, 'PATCH', `/v1/keys/${key.id}`, { token: ops, body: {} })).status, 400);
    assert.equal(await statusOf(gw.base, key.token), 200);

    // Rotate with a grace: both tokens work, the new one at once.
    const rotated = await api(admin, 'POST', `/v1/keys/${key.id}/rotate`, { token: ops, body: { grace: '1h' } });
    assert.equal(rotated.status, 200, rotated.text);
    const fresh = rotated.body.token as string;
    await eventually(async () => (await statusOf(gw.base, fresh)) === 200, 1_000, 'the rotated token served');
    assert.equal(await statusOf(gw.base, key.token), 200, 'the old token within its grace');

    // Usage, as `keyward usage --json` and as its CSV.
    // Three requests so far (served at creation, after the change, within the grace); the ledger writes them within its flush.
    let rows: Array<{ requests: number; key: string }> = [];
    await eventually(
      async () => {
        rows = (await api(admin, 'GET', `/v1/usage?key=${key.id}&by=month`, { token: viewer })).body.rows as typeof rows;
        return (rows[0]?.requests ?? 0) >= 3;
      },
      10_000,
      'the ledger rows written',
    );
    assert.equal((await api(admin, 'GET', `/v1/usage?key=ext:tf-billing`, { token: viewer })).status, 200);
    assert.equal(rows[0]?.key, 'billing');
    const csv = await api(admin, 'GET', '/v1/usage', { token: viewer, headers: { accept: 'text/csv' } });
    assert.match(csv.text, /^day,key,route,requests,/);
    assert.match(csv.text, /billing,seo,/);
    assert.equal((await api(admin, 'GET', '/v1/usage?by=week', { token: viewer })).body.field, 'by');
    assert.equal((await api(admin, 'GET', '/v1/usage?by=day&credential=1', { token: viewer })).body.field, 'credential');

    // Revoke: the key with revokedAt; both tokens refused on the public port within a second.
    const revoked = await api(admin, 'POST', `/v1/keys/${key.id}/revoke`, { token: ops });
    assert.equal(revoked.status, 200);
    assert.ok(typeof revoked.body.revokedAt === 'string');
    await eventually(async () => (await statusOf(gw.base, fresh)) === 401 && (await statusOf(gw.base, key.token)) === 401, 1_000, 'revocation in force');
    assert.equal((await api(admin, 'PATCH', `/v1/keys/${key.id}`, { token: ops, body: { rate: '1/s' } })).status, 409);
    assert.equal((await api(admin, 'POST', `/v1/keys/${key.id}/rotate`, { token: ops })).status, 409);
    const states = await api(admin, 'GET', '/v1/keys?state=revoked', { token: viewer });
    assert.deepEqual(
      (states.body.keys as Array<{ id: string }>).map((k) => k.id),
      [key.id],
    );

    // The audit log: one entry per change, by the admin from its address, with the request's id.
    const audit = await api(admin, 'GET', '/v1/audit?limit=100', { token: viewer });
    assert.equal(audit.body.whole, true);
    const entries = audit.body.entries as AuditEntry[];
    const mine = entries.filter((e) => e.target.id === key.id);
    assert.deepEqual(
      mine.map((e) => e.action),
      ['key.create', 'key.update', 'key.rotate', 'key.revoke'],
    );
    for (const e of mine) {
      assert.deepEqual(e.actor, { kind: 'admin', name: 'ops', address: '127.0.0.1' });
      assert.match(e.requestId ?? '', /^[0-9a-f-]{36}$/);
    }
    assert.deepEqual(
      entries.filter((e) => e.action === 'admin.create').map((e) => [e.target.name, e.changes.role]),
      [
        ['ops', [null, 'write']],
        ['viewer', [null, 'read']],
      ],
    );
    const first = await api(admin, 'GET', '/v1/audit?limit=2', { token: viewer });
    const rest = await api(admin, 'GET', `/v1/audit?limit=1000&cursor=${first.body.next as string}`, { token: viewer });
    assert.equal((first.body.entries as unknown[]).length + (rest.body.entries as unknown[]).length, entries.length);
    const verified = await runCli(['audit', 'verify'], env);
    assert.equal(verified.code, 0, verified.stdout);

    // The log: a line per /v1/ request with the admin's name; no token of either kind anywhere in it.
    const lines = gw
      .output()
      .split('\n')
      .filter((l) => l.includes('"msg":"admin request"'));
    assert.ok(lines.length >= 20);
    assert.ok(lines.some((l) => l.includes('"admin":"ops"')) && lines.some((l) => l.includes('"admin":"viewer"')));
    for (const secret of [ops, viewer, key.token, fresh]) assert.ok(!gw.output().includes(secret), 'a token in the log');
    assert.ok(!gw.output().includes(ops.slice(4, 20)));
  });
});

test('keys file: who may call — no token, a client key, an unknown, a revoked or a read-only admin token; bodies over 64 KiB, unknown fields, bad values', async () => {
  await onKeysFile(async (gw, env) => {
    const admin = gw.admin as string;
    const ops = await adminToken(env, 'ops');
    const viewer = await adminToken(env, 'viewer', 'read');
    const client = await runCli(['keys', 'create', '--name', 'c', '--json'], env);
    const clientToken = (JSON.parse(client.stdout) as { token: string }).token;
    // The CLI wrote the keys file; the gateway picks the change up by watching it.
    await eventually(async () => (await statusOf(gw.base, clientToken)) === 200, 20_000, 'the key made with the CLI served');

    for (const token of [null, clientToken, `kwa_${'A'.repeat(49)}`, ops.slice(0, -1) + (ops.endsWith('a') ? 'b' : 'a')]) {
      const r = await api(admin, 'GET', '/v1/keys', { token });
      assert.equal(r.status, 401);
      assert.equal(r.body.code, 'unauthorized');
      assert.match(String(r.headers['www-authenticate']), /^Bearer/);
    }
    // An admin token never opens the public port, nor travels through it in a URL (refused, and not logged).
    assert.equal(await statusOf(gw.base, ops), 401);
    assert.equal(await statusOf(gw.base, clientToken, `/seo/v3/x?admin=${ops}`), 400);
    assert.ok(!gw.output().includes(ops.slice(4)));
    // Read-only: every change 403, nothing changed.
    for (const [method, path] of [
      ['POST', '/v1/keys'],
      ['PATCH', '/v1/keys/key_x'],
      ['POST', '/v1/keys/key_x/rotate'],
      ['POST', '/v1/keys/key_x/revoke'],
    ] as const) {
      const r = await api(admin, method, path, { token: viewer, body: { name: 'nope' } });
      assert.equal(r.status, 403, `${method} ${path}`);
    }
    // Revoked by the CLI: refused at the next request.
    assert.equal((await api(admin, 'GET', '/v1/keys', { token: viewer })).status, 200);
    assert.equal((await runCli(['admins', 'revoke', 'viewer'], env)).code, 0);
    assert.equal((await api(admin, 'GET', '/v1/keys', { token: viewer })).status, 401);
    const listed = JSON.parse((await runCli(['admins', 'list', '--json'], env)).stdout) as Array<{ name: string; revoked: string | null; digest?: string }>;
    assert.deepEqual(
      listed.map((a) => [a.name, a.revoked === null, a.digest]),
      [
        ['ops', true, undefined],
        ['viewer', false, undefined],
      ],
    );

    // Bodies: 64 KiB taken, one byte more refused (declared, and chunked without a length).
    const big = JSON.stringify({ name: 'big', externalId: 'x'.repeat(10) }).padEnd(64 * 1024, ' ');
    assert.equal((await api(admin, 'POST', '/v1/keys', { token: ops, raw: big })).status, 201);
    const over = await api(admin, 'POST', '/v1/keys', { token: ops, raw: `${big} ` });
    assert.equal(over.status, 413);
    assert.equal(over.body.code, 'payload_too_large');
    const chunked = await request(`${admin}/v1/keys`, {
      method: 'POST',
      headers: { authorization: `Bearer ${ops}`, 'transfer-encoding': 'chunked' },
      body: Buffer.alloc(70 * 1024, 0x20),
    });
    assert.equal(chunked.status, 413);

    // Unknown fields and bad values, named; the CLI's own checks and words.
    const cases: Array<[unknown, string, RegExp]> = [
      [{ name: 'a', colour: 'red' }, 'colour', /Unknown field colour/],
      [{ name: 'a', rate: '10 per second' }, 'rate', /rate must be N\/s/],
      [{ name: 'a', burst: 5 }, 'burst', /burst needs rate/],
      [{ name: 'a', budgets: { nowhere: '5/day' } }, 'budgets', /budgets: nowhere is no route that reports a cost/],
      [{ name: 'a', budgets: { seo: 'lots' } }, 'budgets', /budgets must be ROUTE=AMOUNT/],
      [{ name: 'a', routes: ['nowhere'] }, 'routes', /unknown route/],
      [{ name: 'a', expiresIn: 'soon' }, 'expiresIn', /expiresIn must be a duration/],
      [{ name: 'a', allowFrom: ['10.0.0.0/33'] }, 'allowFrom', /allowFrom must be/],
      [{ name: 'a', concurrency: 1.5 }, 'concurrency', /whole number/],
      [{ name: 'no spaces allowed' }, 'name', /name must be/],
      [{ name: 'a', externalId: 'has space' }, 'externalId', /externalId must be/],
      [{ rate: '1/s' }, 'name', /name is required/],
      // Not the prototype's: an unknown field like any other.
      [{ name: 'a', constructor: 1 }, 'constructor', /Unknown field constructor/],
      [JSON.parse('{"name":"a","__proto__":{"rate":"1/s"}}'), '__proto__', /Unknown field __proto__/],
    ];
    for (const [body, field, message] of cases) {
      const r = await api(admin, 'POST', '/v1/keys', { token: ops, body });
      assert.equal(r.status, 400, JSON.stringify(body));
      assert.equal(r.body.field, field, JSON.stringify(r.body));
      assert.match(String(r.body.error), message);
    }
    for (const raw of ['{"name":', '[1]', '"x"']) assert.equal((await api(admin, 'POST', '/v1/keys', { token: ops, raw })).status, 400);
    assert.equal((await api(admin, 'GET', '/v1/keys?limit=0', { token: ops })).body.field, 'limit');
    assert.equal((await api(admin, 'GET', '/v1/keys?state=gone', { token: ops })).body.field, 'state');
    assert.equal((await api(admin, 'GET', '/v1/keys?colour=red', { token: ops })).body.field, 'colour');
    assert.equal((await api(admin, 'GET', '/v1/audit?cursor=x', { token: ops })).body.field, 'cursor');
    assert.equal((await api(admin, 'POST', '/v1/keys/key_x/revoke', { token: ops, body: { why: 1 } })).status, 400);
    const cid = (JSON.parse(client.stdout) as { id: string }).id;
    assert.equal((await api(admin, 'POST', `/v1/keys/${cid}/rotate`, { token: ops, body: { grace: 'soon' } })).body.field, 'grace');
    assert.equal((await api(admin, 'POST', `/v1/keys/${cid}/rotate`, { token: ops, body: { grace: '400d' } })).body.field, 'grace');
    assert.equal((await api(admin, 'DELETE', '/v1/keys', { token: ops }).catch(() => ({ status: 404 }))).status, 404);
    // The document itself, and the gateway still serving after all of it.
    const doc = await api(admin, 'GET', '/v1/openapi.json', { token: ops });
    assert.equal(doc.body.openapi, '3.1.0');
    assert.equal(await statusOf(gw.base, clientToken), 200);
    // The usage page on a loopback listener stays open (docs/admin-api.md, "Safety").
    assert.equal((await request(`${admin}/usage`)).status, 200);
  });
});

test('off loopback, the usage page needs an admin token (any role); a loopback address is told apart from others', async () => {
  for (const host of ['127.0.0.1', '127.8.9.1', '::1', 'localhost', '::ffff:127.0.0.1']) assert.equal(isLoopbackHost(host), true, host);
  for (const host of ['0.0.0.0', '::', '10.0.0.1', '192.0.2.7', 'admin.example']) assert.equal(isLoopbackHost(host), false, host);
  // A listener that treats itself as reachable from elsewhere (KEYWARD_ADMIN_EXPOSED for tests on one machine: bound to loopback all the same).
  await onKeysFile(
    async (gw, env) => {
      const admin = gw.admin as string;
      const viewer = await adminToken(env, 'viewer', 'read');
      assert.equal((await request(`${admin}/usage`)).status, 401);
      const client = JSON.parse((await runCli(['keys', 'create', '--name', 'c', '--json'], env)).stdout) as { token: string };
      assert.equal((await request(`${admin}/usage`, { headers: { authorization: `Bearer ${client.token}` } })).status, 401);
      assert.equal((await request(`${admin}/usage`, { headers: { authorization: `Bearer ${viewer}` } })).status, 200);
      // Health and metrics stay open.
      assert.equal((await request(`${admin}/healthz`)).status, 200);
    },
    { KEYWARD_ADMIN_REQUIRE_TOKEN: 'on' },
  );
});

test('with two workers the primary answers the API; a key made over HTTP works on the workers', { timeout: 120_000 }, async () => {
  await onKeysFile(
    async (gw, env) => {
      const ops = await adminToken(env, 'ops');
      const made = await api(gw.admin as string, 'POST', '/v1/keys', { token: ops, body: { name: 'w', allowFrom: ['127.0.0.1'] } });
      assert.equal(made.status, 201);
      await eventually(async () => (await statusOf(gw.base, made.body.token as string)) === 200, 2_000, 'served by the workers');
    },
    { KEYWARD_WORKERS: '2' },
  );
});

test(
  'PostgreSQL, two gateways: a key made over HTTP on one works on the other within a second; concurrent changes from both keep one whole chain',
  { timeout: 240_000 },
  async () => {
    await withFleet(async (f) => {
      const a = await f.gateway();
      const b = await f.gateway();
      const ops = await adminToken(f.env, 'ops');
      const made = await api(a.admin as string, 'POST', '/v1/keys', { token: ops, body: { name: 'shared', externalId: 'ext-1', quota: '100/day' } });
      assert.equal(made.status, 201, made.text);
      const at = Date.now();
      await eventually(async () => (await statusOf(b.base, made.body.token as string)) === 200, 1_000, 'the key served by the other gateway');
      assert.ok(Date.now() - at <= 1_500);
      // The other gateway reads it by ext: at once (the same table).
      assert.equal((await api(b.admin as string, 'GET', '/v1/keys/ext:ext-1', { token: ops })).body.id, made.body.id);
      // An admin token revoked through one host stops at once on both.
      const temp = await adminToken(f.env, 'temp', 'read');
      assert.equal((await api(b.admin as string, 'GET', '/v1/keys', { token: temp })).status, 200);
      assert.equal((await runCli(['admins', 'revoke', 'temp'], f.env)).code, 0);
      assert.equal((await api(a.admin as string, 'GET', '/v1/keys', { token: temp })).status, 401);
      assert.equal((await api(b.admin as string, 'GET', '/v1/keys', { token: temp })).status, 401);

      // Twenty changes at once through both gateways: creates, updates and revokes.
      const work: Array<Promise<Answer>> = [];
      for (let i = 0; i < 10; i++) {
        const gw = (i % 2 === 0 ? a : b).admin as string;
        work.push(api(gw, 'POST', '/v1/keys', { token: ops, body: { name: `many-${i}`, externalId: `many-${i}` } }));
        work.push(
          api(gw === a.admin ? (b.admin as string) : (a.admin as string), 'PATCH', `/v1/keys/${made.body.id as string}`, {
            token: ops,
            body: { rate: `${i + 1}/s` },
          }),
        );
      }
      const answers = await Promise.all(work);
      assert.deepEqual(answers.map((r) => r.status).sort(), [...Array<number>(10).fill(200), ...Array<number>(10).fill(201)].sort());
      const audit = await api(b.admin as string, 'GET', '/v1/audit?limit=1000', { token: ops });
      assert.equal(audit.body.whole, true);
      const entries = audit.body.entries as AuditEntry[];
      assert.deepEqual(
        entries.map((e) => e.seq),
        entries.map((_e, i) => i + 1),
      );
      assert.equal(entries.filter((e) => e.action === 'key.create' && e.target.name.startsWith('many-')).length, 10);
      assert.equal(entries.filter((e) => e.action === 'key.update' && e.target.id === made.body.id).length, 10);
      const verified = await runCli(['audit', 'verify'], f.env, undefined, 60_000);
      assert.equal(verified.code, 0, verified.stdout);
      // Usage over HTTP from the shared ledger, as JSON and CSV.
      assert.equal((await api(a.admin as string, 'GET', '/v1/usage?by=credential', { token: ops })).status, 200);
      assert.match((await api(b.admin as string, 'GET', '/v1/usage', { token: ops, headers: { accept: 'text/csv' } })).text, /^day,key,route,/);
      // Rotated through one gateway, revoked through the other: each in force on both within a second.
      const rotated = await api(b.admin as string, 'POST', '/v1/keys/ext:ext-1/rotate', { token: ops, body: { grace: '1h' } });
      assert.equal(rotated.status, 200, rotated.text);
      await eventually(async () => (await statusOf(a.base, rotated.body.token as string)) === 200, 1_000, 'the rotated token on the other gateway');
      const revoked = await api(a.admin as string, 'POST', `/v1/keys/${made.body.id as string}/revoke`, { token: ops });
      assert.equal(revoked.status, 200);
      await eventually(
        async () => (await statusOf(b.base, rotated.body.token as string)) === 401 && (await statusOf(b.base, made.body.token as string)) === 401,
        1_000,
        'the revocation on the other gateway',
      );
      const listed = await api(b.admin as string, 'GET', '/v1/keys?state=revoked&limit=1', { token: ops });
      assert.deepEqual(
        (listed.body.keys as Array<{ id: string }>).map((k) => k.id),
        [made.body.id],
      );
      const tail = (await api(a.admin as string, 'GET', '/v1/audit?limit=1000', { token: ops })).body.entries as AuditEntry[];
      assert.deepEqual(
        tail.slice(-2).map((e) => [e.action, e.actor]),
        [
          ['key.rotate', { kind: 'admin', name: 'ops', address: '127.0.0.1' }],
          ['key.revoke', { kind: 'admin', name: 'ops', address: '127.0.0.1' }],
        ],
      );
    });
  },
);

/** The curl examples of docs/admin-api.md's "Endpoints", in order: the shell lines and the operation each names. */
function docExamples(): { setup: string[]; curls: Array<{ line: string; op: string }> } {
  const doc = readFileSync(new URL('../../docs/admin-api.md', import.meta.url), 'utf8');
  const part = doc.slice(doc.indexOf('## Endpoints'));
  const lines = [...part.matchAll(/```sh\n([\s\S]*?)```/g)].flatMap((m) => (m[1] as string).split('\n').filter((l) => l.trim() !== ''));
  const setup = lines.filter((l) => !l.startsWith('curl '));
  const curls = lines
    .filter((l) => l.startsWith('curl '))
    .map((line) => {
      const method = /-X (\w+)/.exec(line)?.[1] ?? 'GET';
      const path = /"\$KEYWARD_ADMIN(\/v1\/[^"?]*)/.exec(line)?.[1] ?? '';
      return { line, op: `${method} ${template(path)}` };
    });
  return { setup, curls };
}

test('docs/admin-api.md: an example for every operation of the OpenAPI document and none other, each run as written and answered with success', async () => {
  const { setup, curls } = docExamples();
  const operations = [...new Set(documented().map((d) => d.split(' ').slice(0, 2).join(' ')))].sort();
  assert.deepEqual([...new Set(curls.map((c) => c.op))].sort(), operations);
  await onKeysFile(async (gw, env) => {
    const dir = mkdtempSync(join(tmpdir(), 'keyward-admin-doc-'));
    try {
      // `keyward` as the page writes it: this checkout's.
      symlinkSync(fileURLToPath(new URL('../../bin/keyward', import.meta.url)), join(dir, 'keyward'));
      const script = [
        'set -e',
        ...setup.map((l) => l.replace(/^export KEYWARD_ADMIN=.*$/, `export KEYWARD_ADMIN=${gw.admin as string}`)),
        ...curls.map((c) => `${c.line}; echo`),
      ];
      const r = await promisify(execFile)('bash', ['-c', script.join('\n')], { env: { ...env, PATH: `${dir}:${process.env.PATH ?? ''}` }, timeout: 60_000 });
      const answers = r.stdout.split('\n').filter((l) => l.startsWith('{'));
      // Every JSON answer of the examples conforms to its operation's success schema.
      const jsonCurls = curls.filter((c) => !c.line.includes('text/csv'));
      assert.equal(answers.length, jsonCurls.length, r.stdout);
      jsonCurls.forEach((c, i) => {
        const [method, path] = c.op.split(' ') as [string, string];
        const status = method === 'POST' && path === '/v1/keys' ? 201 : 200;
        answered.add(conforms(method, path, status, JSON.parse(answers[i] as string)));
      });
      assert.match(r.stdout, /^day,key,route,requests,/m);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

after(() => {
  // Every success status the document names was answered by some test above (each answer held to the document).
  const successes = documented().filter((d) => /\s2\d\d$/.test(d));
  const missing = successes.filter((d) => !answered.has(d));
  const filtered = [...process.argv, ...process.execArgv].some((a) => a.startsWith('--test-name-pattern'));
  if (!filtered) assert.deepEqual(missing, [], `endpoints never answered: ${missing.join(', ')}`);
});
