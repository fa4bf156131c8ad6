// A keys file written by a newer keyward (docs/keys.md, "Versions"): the
// rollback of the fourth-hour issue, where a key given a scraper budget by
// the newer CLI made the older gateway refuse the whole file, and a gateway
// already running kept serving a key the newer CLI had revoked, ready all
// the while. This version must read what the next one writes: unknown
// fields kept and ignored, a key whose rules it cannot enforce refused
// alone with 503, revocations and expiries applied whatever else a record
// holds, and a file it cannot read at all never served as ready.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { runCli } from '../support/cli.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';
import { generateToken, tokenDigest } from '../../src/keys/token.ts';

const created = '2026-11-01T00:00:00.000Z';

/** A record as a newer keyward might write it, with a token to present. */
function key(id: string, extra: Record<string, unknown> = {}): { token: string; record: Record<string, unknown> } {
  const token = generateToken();
  return { token, record: { id, name: id, digest: `sha256:${tokenDigest(token)}`, created, expires: null, revoked: null, ...extra } };
}

test('a keys file from a newer keyward: unknown fields ignored and kept, unenforceable keys refused alone, revocations applied', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-newer-'));
  const file = join(dir, 'keys.json');
  const plain = key('key_plain', { externalId: 'billing-service', labels: { team: 'a' } });
  const restricted = key('key_restricted', { requires: 2, allowFrom: ['10.0.0.0/8'] });
  const unknownLimit = key('key_tokens', { limits: { tokensPerDay: 5 } });
  const costless = key('key_new_route_budget', { limits: { budgets: { translate: '5/day' } } });
  const revoked = key('key_revoked_newer', { requires: 3, revoked: '2026-11-02T00:00:00.000Z' });
  const expired = key('key_expired_newer', { limits: { tokensPerDay: 5 }, expires: '2026-11-02T00:00:00.000Z' });
  const all = [plain, restricted, unknownLimit, costless, revoked, expired];
  writeFileSync(file, `{"version":2,"writtenBy":"keyward 9.9.9","keys":[\n${all.map((k) => JSON.stringify(k.record)).join(',\n')}\n]}\n`, { mode: 0o600 });
  const up = await startUpstream();
  // The test key is added by the CLI's own code path: the newer records must survive the rewrite.
  const gw = await startGateway({ seo: up.url, speech: up.url, dir });
  try {
    const status = async (token: string): Promise<{ status: number; code?: string }> => {
      const r = await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${token}` } });
      return { status: r.status, ...(r.status >= 400 ? { code: (JSON.parse(r.body.toString()) as { code: string }).code } : {}) };
    };
    assert.deepEqual(await status(plain.token), { status: 200 }, 'a key with fields this version does not know is served');
    assert.deepEqual(await status(gw.token), { status: 200 });
    const forwarded = up.requests.length;
    for (const k of [restricted, unknownLimit, costless])
      assert.deepEqual(await status(k.token), { status: 503, code: 'key_unsupported' }, k.record.id as string);
    assert.deepEqual(await status(revoked.token), { status: 401, code: 'unauthorized' }, 'a revocation applies whatever the key requires');
    assert.deepEqual(await status(expired.token), { status: 401, code: 'unauthorized' }, 'an expiry applies whatever the key holds');
    assert.equal(up.requests.length, forwarded, 'nothing of a refused key reached the upstream');

    const ready = gw.gateway.readiness();
    assert.equal(ready.ready, true, 'every other key serves');
    assert.equal(ready.keysUnsupported, 3);
    const warning = gw.logs().find((l) => String(l.msg).startsWith('keys with rules this version cannot enforce'));
    assert.deepEqual(warning?.ids, ['key_restricted', 'key_tokens', 'key_new_route_budget']);
    assert.doesNotMatch(gw.logText(), new RegExp(all.map((k) => k.token).join('|')), 'no token in any line');

    // What the CLI wrote back when it added the test key: every newer record as it was.
    const stored = JSON.parse(readFileSync(file, 'utf8')) as { keys: Array<Record<string, unknown>> };
    for (const k of all)
      assert.deepEqual(
        stored.keys.find((r) => r.id === k.record.id),
        k.record,
      );

    const env = { KEYWARD_KEYS_FILE: file };
    const listed = await runCli(['keys', 'list', '--json'], env);
    assert.equal(listed.code, 0, listed.stderr);
    const rows = JSON.parse(listed.stdout) as Array<{ id: string; unsupported?: string }>;
    assert.match(rows.find((r) => r.id === 'key_restricted')?.unsupported ?? '', /record format 2; this keyward reads format 1/);
    assert.match(rows.find((r) => r.id === 'key_new_route_budget')?.unsupported ?? '', /budgets apply to routes that report a cost/);
    assert.equal(rows.find((r) => r.id === 'key_plain')?.unsupported, undefined);
    const table = await runCli(['keys', 'list'], env);
    assert.match(table.stderr, /3 keys need a newer keyward .*key_restricted/);
    assert.match(table.stdout, /key_tokens .*needs a newer keyward/);

    // This version's CLI revokes a key it cannot serve, keeping the rest of it; the gateway applies it.
    const revoking = await runCli(['keys', 'revoke', 'key_restricted'], env);
    assert.equal(revoking.code, 0, revoking.stderr);
    await eventually(async () => (await status(restricted.token)).status === 401, 5_000, 'the revocation in force');
    const after = (JSON.parse(readFileSync(file, 'utf8')) as { keys: Array<Record<string, unknown>> }).keys.find((r) => r.id === 'key_restricted');
    assert.deepEqual(after?.allowFrom, ['10.0.0.0/8']);
    assert.equal(after?.requires, 2);
    assert.equal(typeof after?.revoked, 'string');
    await eventually(async () => gw.gateway.readiness().keysUnsupported === 2, 5_000, 'two left unsupported');
  } finally {
    await gw.close();
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a keys file that cannot be read at all keeps the last good set serving, with readiness at 503 until it parses', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  try {
    const file = gw.store.location;
    const good = readFileSync(file, 'utf8');
    assert.equal(gw.gateway.readiness().ready, true);
    writeFileSync(`${file}.new`, good.replace('"keys":', '"keys":{').replace(/\]\}\n$/, ']}}\n'));
    renameSync(`${file}.new`, file);
    await eventually(async () => gw.gateway.readiness().ready === false, 5_000, 'readiness down');
    const down = gw.gateway.readiness();
    assert.equal(down.reason, 'keys file cannot be applied');
    assert.equal(down.stale, true);
    assert.match(down.problem ?? '', /cannot be read/);
    // The last good set still answers (a load balancer decides where traffic goes).
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status, 200);
    writeFileSync(`${file}.new`, good);
    renameSync(`${file}.new`, file);
    await eventually(async () => gw.gateway.readiness().ready === true, 5_000, 'ready again');
  } finally {
    await gw.close();
    await up.close();
  }
});
