// Round 4, point 2 (docs/security.md, "What the audit log proves"):
// deleting the last entry, the last three, every row or the audit file
// itself left a chain that still verified: `keyward audit verify` said
// "whole" and `GET /v1/audit` said `whole:true`. The log is now held to
// anchors outside itself: the keys store's record of its head, the head a
// gateway logged (`--head SEQ:HASH`), and the keys and admin tokens it holds.
import assert from 'node:assert/strict';
import { cpSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { runCli } from '../support/cli.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway } from '../support/fleet.ts';
import { startDatabase } from '../support/postgres.ts';
import { auditOf, parseHead } from '../../src/keys/audit-check.ts';
import { createKey, revokeKey, rotateKey, updateKey } from '../../src/keys/manage.ts';
import { PgKeyStore } from '../../src/keys/pg-store.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';

const COST_ROUTES = costRoutes(UPSTREAMS);

/** Run `sql` on a copy's audit log. */
function onLog(dir: string, sql: string): void {
  const db = new DatabaseSync(join(dir, 'keys.json.audit.sqlite'));
  try {
    db.exec(sql);
  } finally {
    db.close();
  }
}

test('keys file: a log cut at its end, emptied or removed fails verify and the API; the head a gateway logged catches a log written again', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-audit-cut-'));
  const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_SEO_URL: 'http://127.0.0.1:9', KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p' };
  try {
    const admin = await runCli(['admins', 'create', '--name', 'ops', '--json'], env);
    const ops = (JSON.parse(admin.stdout) as { token: string }).token;
    for (const name of ['a', 'b', 'c']) assert.equal((await runCli(['keys', 'create', '--name', name], env)).code, 0);
    const gw = await startFleetGateway(env);
    let logged: string;
    try {
      assert.equal((await runCli(['keys', 'update', 'a', '--rate', '5/s'], env)).code, 0);
      assert.equal((await runCli(['keys', 'revoke', 'b'], env)).code, 0);
      // The gateway logs the head of each change it loads: the journal's anchor.
      const headLine = (): { auditHead: string } | undefined =>
        gw
          .output()
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as { msg?: string; auditSeq?: number; auditHead: string })
          .find((l) => l.msg === 'audit log head' && l.auditSeq === 6);
      await eventually(() => headLine() !== undefined, 10_000, 'the gateway logged the head after the revocation');
      logged = (headLine() as { auditHead: string }).auditHead;
      assert.ok(parseHead(logged) !== null, logged);
      const whole = await request(`${gw.admin as string}/v1/audit`, { headers: { authorization: `Bearer ${ops}` } });
      assert.equal((whole.json() as { whole: boolean }).whole, true);
      // Cut under the running gateway: its API says so.
      const backup = mkdtempSync(join(tmpdir(), 'keyward-audit-cut-copy-'));
      cpSync(dir, backup, { recursive: true });
      onLog(dir, 'delete from audit where seq = (select max(seq) from audit)');
      const cut = await request(`${gw.admin as string}/v1/audit`, { headers: { authorization: `Bearer ${ops}` } });
      assert.equal((cut.json() as { whole: boolean }).whole, false, 'GET /v1/audit: not whole');
      cpSync(backup, dir, { recursive: true });
      rmSync(backup, { recursive: true, force: true });
    } finally {
      await gw.stop().catch(() => gw.kill());
    }
    assert.equal((await runCli(['audit', 'verify'], env)).code, 0, 'whole before any cut');
    assert.equal((await runCli(['audit', 'verify', '--head', logged], env)).code, 0, 'whole at the head the gateway logged');
    assert.equal((await runCli(['audit', 'verify', '--head', 'nonsense'], env)).code, 2);

    const cuts: Array<[string, (copy: string) => void, RegExp]> = [
      ['the last entry', (d) => onLog(d, 'delete from audit where seq = (select max(seq) from audit)'), /cut from its end|not what its last entry says/],
      ['the last three', (d) => onLog(d, 'delete from audit where seq > (select max(seq) - 3 from audit)'), /cut from its end|not what its last entry says/],
      ['every row', (d) => onLog(d, 'delete from audit'), /cut from its end|log is empty/],
      ['the file', (d) => rmSync(join(d, 'keys.json.audit.sqlite')), /cut from its end|log is empty/],
    ];
    for (const [what, cutIt, why] of cuts) {
      const copy = mkdtempSync(join(tmpdir(), 'keyward-audit-cut-case-'));
      try {
        cpSync(dir, copy, { recursive: true });
        cutIt(copy);
        const r = await runCli(['audit', 'verify'], { KEYWARD_KEYS_FILE: join(copy, 'keys.json') });
        assert.equal(r.code, 1, `${what}: ${r.stdout}`);
        assert.match(r.stdout, why, what);
      } finally {
        rmSync(copy, { recursive: true, force: true });
      }
    }

    // Cut and written again: the last entry removed, another change made in its place. The keys
    // file's record moves with the new write; the head the gateway logged does not.
    onLog(dir, 'delete from audit where seq = (select max(seq) from audit)');
    assert.equal((await runCli(['keys', 'create', '--name', 'd'], env)).code, 0);
    const again = await runCli(['audit', 'verify', '--head', logged], env);
    assert.equal(again.code, 1, again.stdout);
    assert.match(again.stdout, /not the one --head recorded/);
    const beyond = await runCli(['audit', 'verify', '--head', `99:${'0'.repeat(64)}`], env);
    assert.equal(beyond.code, 1);
    assert.match(beyond.stdout, /ends at entry/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('PostgreSQL: every row deleted, or every row past a point, fails verify; a key changed by SQL without its entry too', async () => {
  const db = await startDatabase();
  const store = new PgKeyStore(db.url, COST_ROUTES);
  try {
    await store.migrate();
    for (let i = 0; i < 5; i++) await createKey(store, `k${i}`);
    await updateKey(store, 'k1', { limits: () => ({ rate: '5/s' }) });
    await revokeKey(store, 'k2');
    assert.equal(await auditOf(store, await store.auditEntries()), null, 'whole');
    const env = { KEYWARD_DATABASE_URL: db.url };
    assert.equal((await runCli(['audit', 'verify'], env)).code, 0);

    // Rotations change no field an entry shows: cutting them off is seen by the store's record of the head alone.
    await rotateKey(store, 'k3', 0);
    await rotateKey(store, 'k4', 0);
    assert.equal(await auditOf(store, await store.auditEntries()), null, 'whole with the rotations');
    await db.admin`delete from keyward_audit where seq > 7`;
    const rotations = await auditOf(store, await store.auditEntries());
    assert.match(String(rotations?.why), /keyward_audit_head\) records entry 9 as the log.s head, but the log ends at entry 7/);
    await db.admin`delete from keyward_audit where seq > 5`;
    const past = await auditOf(store, await store.auditEntries());
    assert.match(String(past?.why), /cut from its end/);
    // With the store's record removed too, the keys still say what is missing.
    await db.admin`delete from keyward_audit_head`;
    const noHead = await auditOf(store, await store.auditEntries());
    assert.match(String(noHead?.why), /not what its last entry says/, 'the update and the revocation are gone from the log, not from the keys');
    await db.admin`delete from keyward_audit`;
    const r = await runCli(['audit', 'verify'], env);
    assert.equal(r.code, 1, r.stdout);
    assert.match(r.stdout, /the log is empty, but the store holds key/);
  } finally {
    await store.close();
    await db.close();
  }
});
