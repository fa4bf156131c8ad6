// docs/operations.md, "Audit log": every change to keys appends one entry,
// chained by SHA-256; `keyward audit verify` finds an edited, a removed and a
// moved entry; a change whose entry cannot be written is not made; in a
// fleet the chain is one, also under changes from several hosts at once.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DatabaseSync } from 'node:sqlite';
import { test } from 'node:test';
import { createKey, revokeKey, updateKey } from '../../src/keys/manage.ts';
import { PgKeyStore } from '../../src/keys/pg-store.ts';
import { verify, type AuditEntry } from '../../src/keys/audit.ts';
import { runCli } from '../support/cli.ts';
import { startDatabase } from '../support/postgres.ts';

const COST_ROUTES = ['seo', 'speech', 'scraper'];

test('keys file: one entry per change, by the OS user, never a token or digest; verify finds an edited, a removed and a moved entry', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-audit-'));
  const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
  try {
    const made = await runCli(['keys', 'create', '--name', 'alice', '--quota', '5/day', '--json'], env);
    assert.equal(made.code, 0, made.stderr);
    const { token } = JSON.parse(made.stdout) as { token: string };
    assert.equal((await runCli(['keys', 'update', 'alice', '--quota', 'none', '--allow-from', '10.0.0.0/8'], env)).code, 0);
    assert.equal((await runCli(['keys', 'rotate', 'alice', '--grace', '1h'], env)).code, 0);
    assert.equal((await runCli(['keys', 'revoke', 'alice'], env)).code, 0);
    // An import: one entry per key it adds.
    const other = join(dir, 'other.json');
    writeFileSync(
      other,
      JSON.stringify({
        version: 1,
        keys: [1, 2].map((i) => ({
          id: `key_imported${i}`,
          name: `imp${i}`,
          digest: `sha256:${String(i).repeat(64)}`,
          created: '2026-01-01T00:00:00Z',
          expires: null,
          revoked: null,
        })),
      }),
    );
    assert.equal((await runCli(['keys', 'import', other], env)).code, 0);
    const listed = await runCli(['audit', '--json'], env);
    assert.equal(listed.code, 0, listed.stderr);
    const entries = JSON.parse(listed.stdout) as AuditEntry[];
    assert.deepEqual(
      entries.map((e) => [e.seq, e.action, e.target.name]),
      [
        [1, 'key.create', 'alice'],
        [2, 'key.update', 'alice'],
        [3, 'key.rotate', 'alice'],
        [4, 'key.revoke', 'alice'],
        [5, 'key.import', 'imp1'],
        [6, 'key.import', 'imp2'],
      ],
    );
    assert.deepEqual(entries[1]?.changes, { limits: [{ quota: '5/day' }, { allowFrom: ['10.0.0.0/8'] }] });
    assert.equal(entries[0]?.actor.kind, 'cli');
    const raw = readFileSync(join(dir, 'keys.json'), 'utf8');
    const digest = /"digest": ?"(sha256:[0-9a-f]{64})"/.exec(raw)?.[1] as string;
    assert.ok(!listed.stdout.includes(token) && !listed.stdout.includes(digest.slice(7)), 'never a token or a digest');
    const table = await runCli(['audit'], env);
    assert.match(table.stdout, /SEQ +AT +BY +ACTION/);
    assert.match(table.stdout, /key\.revoke/);
    assert.equal((await runCli(['audit', 'verify'], env)).code, 0);

    const db = join(dir, 'keys.json.audit.sqlite');
    const tamper = (sql: string): void => {
      const d = new DatabaseSync(db);
      d.exec(sql);
      d.close();
    };
    const broken = async (): Promise<string> => {
      const r = await runCli(['audit', 'verify'], env);
      assert.equal(r.code, 1);
      return r.stdout;
    };
    const copy = readFileSync(db);
    const restore = (): void => {
      for (const f of ['-wal', '-shm']) rmSync(`${db}${f}`, { force: true });
      writeFileSync(db, copy);
    };
    // Edited: entry 2's body changed (a limit removed from the record of what happened).
    tamper(`update audit set body = replace(body, '5/day', '50/day') where seq = 2`);
    assert.match(await broken(), /broken at entry 2: entry 2 does not match its hash/);
    restore();
    assert.equal((await runCli(['audit', 'verify'], env)).code, 0, 'the copy is whole again');
    // Removed: entry 3 gone.
    tamper('delete from audit where seq = 3');
    assert.match(await broken(), /broken at entry 4: entry 3 is missing/);
    restore();
    // Moved: entries 4 and 5 swapped.
    tamper('update audit set seq = -4 where seq = 4; update audit set seq = 4 where seq = 5; update audit set seq = 5 where seq = -4');
    assert.match(await broken(), /broken at entry 4/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('a change whose audit entry cannot be written is not made', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-audit-'));
  const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
  try {
    assert.equal((await runCli(['keys', 'create', '--name', 'bob'], env)).code, 0);
    const before = readFileSync(join(dir, 'keys.json'), 'utf8');
    // The log's file replaced by a folder: no entry can be written.
    rmSync(join(dir, 'keys.json.audit.sqlite'), { force: true });
    for (const f of ['-wal', '-shm']) rmSync(join(dir, `keys.json.audit.sqlite${f}`), { force: true });
    mkdirSync(join(dir, 'keys.json.audit.sqlite'));
    const r = await runCli(['keys', 'revoke', 'bob'], env);
    assert.equal(r.code, 1);
    assert.match(r.stderr, /the audit log .* cannot be written .*nothing was changed/);
    assert.equal(readFileSync(join(dir, 'keys.json'), 'utf8'), before, 'the key is not revoked');
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('PostgreSQL: one chain for the fleet, whole under concurrent changes from two hosts; verify finds an edit made with SQL', async () => {
  const db = await startDatabase();
  const a = new PgKeyStore(db.url, COST_ROUTES);
  const b = new PgKeyStore(db.url, COST_ROUTES);
  try {
    await a.migrate();
    // Two hosts changing keys at once.
    await Promise.all([
      ...Array.from({ length: 8 }, (_, i) => createKey(a, `a${i}`, {}, Date.now(), { actor: { kind: 'cli', user: 'host-a' } })),
      ...Array.from({ length: 8 }, (_, i) => createKey(b, `b${i}`, {}, Date.now(), { actor: { kind: 'cli', user: 'host-b' } })),
    ]);
    await updateKey(a, 'a1', { limits: () => ({ rate: '5/s' }) }, Date.now(), { actor: { kind: 'admin', name: 'portal', address: '10.0.0.5' } });
    await revokeKey(b, 'b2');
    const entries = await b.auditEntries();
    assert.equal(entries.length, 18);
    assert.deepEqual(
      entries.map((e) => e.seq),
      Array.from({ length: 18 }, (_, i) => i + 1),
    );
    assert.equal(verify(entries), null, 'one unbroken chain');
    assert.deepEqual(new Set(entries.slice(0, 16).map((e) => (e.actor as { user: string }).user)), new Set(['host-a', 'host-b']));
    assert.deepEqual(entries[16]?.actor, { kind: 'admin', name: 'portal', address: '10.0.0.5' });
    const env = { KEYWARD_DATABASE_URL: db.url };
    assert.equal((await runCli(['audit', 'verify'], env)).code, 0);
    await db.admin`update keyward_audit set body = replace(body, '"b2"', '"someone-else"') where seq = 18`;
    const r = await runCli(['audit', 'verify'], env);
    assert.equal(r.code, 1);
    assert.match(r.stdout, /broken at entry 18/);
  } finally {
    await a.close();
    await b.close();
    await db.close();
  }
});
