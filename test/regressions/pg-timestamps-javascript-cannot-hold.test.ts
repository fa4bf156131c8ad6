// A timestamp PostgreSQL allows and JavaScript cannot hold ('infinity',
// '-infinity', a year before the Common Era, a year past 275760) used to
// throw while a row was read, before the record check: every read failed,
// revocations stopped applying while the gateways said they were ready, and
// the CLI failed on every command. Each such row is now judged alone
// (docs/fleet.md, "Rows keyward would never write").
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { runCli } from '../support/cli.ts';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf, type FleetGateway } from '../support/fleet.ts';
import { startDatabase } from '../support/postgres.ts';
import { startUpstream } from '../support/upstream.ts';

interface Created {
  id: string;
  token: string;
}

test(
  'rows at infinity, -infinity, BC and past year 275760: judged alone; revocations by CLI and SQL reach three gateways within a second',
  { timeout: 120_000 },
  async () => {
    const db = await startDatabase();
    const up = await startUpstream();
    const env = { KEYWARD_DATABASE_URL: db.url, KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p', KEYWARD_ADMIN_PORT: 'off' };
    const gateways: FleetGateway[] = [];
    try {
      assert.equal((await runCli(['db', 'migrate'], env)).code, 0);
      const keys: Record<string, Created> = {};
      for (const name of ['alice', 'bob', 'carol', 'dave', 'erin', 'frank', 'grace', 'heidi']) {
        const r = await runCli(['keys', 'create', '--name', name, '--json'], env);
        assert.equal(r.code, 0, r.stderr);
        keys[name] = JSON.parse(r.stdout) as Created;
      }
      const k = (name: string): Created => keys[name] as Created;
      for (let i = 0; i < 3; i++) gateways.push(await startFleetGateway(env));
      const all = async (name: string, want: number): Promise<boolean> =>
        (await Promise.all(gateways.map((g) => statusOf(g.base, k(name).token)))).every((s) => s === want);
      await eventually(() => all('alice', 200), 5_000, 'alice served by all three');

      // PostgreSQL's spelling of "never", then a revocation by the CLI.
      await db.admin`update keyward_keys set expires = 'infinity' where name = 'bob'`;
      const revoke = await runCli(['keys', 'revoke', 'alice'], env);
      assert.equal(revoke.code, 0, `keys revoke with a row at infinity: ${revoke.stderr}`);
      const cliAt = performance.now();
      await eventually(() => all('alice', 401), 1_000, 'a CLI revocation refused by all three gateways within a second');
      const cliMs = performance.now() - cliAt;
      assert.ok(await all('bob', 200), 'expires = infinity: never expires');

      // And one made by SQL.
      const sqlAt = performance.now();
      await db.admin`update keyward_keys set revoked = now() where name = 'carol'`;
      await eventually(() => all('carol', 401), 1_000, 'an SQL revocation refused by all three gateways within a second');
      const sqlMs = performance.now() - sqlAt;

      // The other forms, each judged alone.
      await db.admin`update keyward_keys set revoked = '-infinity' where name = 'dave'`; // revoked
      await db.admin`update keyward_keys set created = 'infinity' where name = 'erin'`; // cannot be placed: fails the record check
      await db.admin`update keyward_keys set expires = '0044-03-15 BC' where name = 'frank'`; // long expired
      await db.admin`update keyward_keys set expires = '275760-09-14' where name = 'grace'`; // past JavaScript's range: fails the check
      await db.admin`update keyward_keys set revoked = 'infinity' where name = 'heidi'`; // a revocation that can never be placed: fails closed
      for (const name of ['dave', 'erin', 'frank', 'grace', 'heidi']) await eventually(() => all(name, 401), 2_000, `${name} refused`);
      assert.ok(await all('bob', 200), 'the other keys keep serving');
      for (const g of gateways) {
        // Log lines leave in batches: wait for them rather than for a time.
        await eventually(
          () =>
            g
              .output()
              .split('\n')
              .filter((l) => l.includes('stored key skipped')).length >= 3,
          5_000,
          'three rows reported as skipped',
        );
        const skipped = g
          .output()
          .split('\n')
          .filter((l) => l.includes('stored key skipped'))
          .map((l) => JSON.parse(l) as { id: string; problem: string });
        assert.deepEqual(skipped.map((s) => s.id).sort(), [k('erin').id, k('grace').id, k('heidi').id].sort(), 'each unplaceable row logged once, by id');
        assert.match(skipped.find((s) => s.id === k('erin').id)?.problem ?? '', /created must be a date/);
      }

      // The CLI lists and changes the other keys as usual.
      const listed = await runCli(['keys', 'list', '--json'], env);
      assert.equal(listed.code, 0, listed.stderr);
      const rows = JSON.parse(listed.stdout) as Array<{ name: string; expires: string | null; revoked: string | null }>;
      assert.equal(rows.find((r) => r.name === 'bob')?.expires, null);
      assert.notEqual(rows.find((r) => r.name === 'dave')?.revoked ?? null, null);
      assert.equal(
        rows.some((r) => r.name === 'erin'),
        false,
        'a row that fails the check is not listed',
      );
      assert.equal((await runCli(['keys', 'update', 'bob', '--rate', '100/s'], env)).code, 0);
      assert.equal((await runCli(['keys', 'revoke', 'bob'], env)).code, 0, 'a key at infinity can itself be revoked');
      await eventually(() => all('bob', 401), 1_000, 'bob revoked');

      // A gateway started now serves the valid keys (it answered 503 to every key before).
      const late = await startFleetGateway(env);
      gateways.push(late);
      const fresh = JSON.parse((await runCli(['keys', 'create', '--name', 'ivan', '--json'], env)).stdout) as Created;
      await eventually(async () => (await statusOf(late.base, fresh.token)) === 200, 2_000, 'a gateway started with such rows serves');
      assert.equal(await statusOf(late.base, k('bob').token), 401);
      console.log(`with a row at infinity: CLI revocation on three gateways in ${cliMs.toFixed(0)} ms, SQL revocation in ${sqlMs.toFixed(0)} ms`);
    } finally {
      for (const g of gateways) await g.stop().catch(() => g.kill());
      await up.close();
      await db.close();
    }
  },
);
