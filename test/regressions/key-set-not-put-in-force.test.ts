// A key set the gateway could not put in force (docs/fleet.md): the store
// reports itself down and applies it again; the version held never moves
// past a set that is not in force.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { PgKeyStore } from '../../src/keys/pg-store.ts';
import { generateToken, tokenDigest as hexDigest } from '../../src/keys/token.ts';
import { eventually } from '../support/deadline.ts';
import { startDatabase, type TestDatabase } from '../support/postgres.ts';
import { costRoutes, UPSTREAMS } from '../../src/request/routes.ts';

const tokenDigest = (token: string): string => `sha256:${hexDigest(token)}`;

/** A key written straight into the table, as a DBA would (no version: the triggers give it one). */
async function insertBySql(db: TestDatabase, name: string, previous: unknown = []): Promise<{ id: string; token: string }> {
  const token = generateToken();
  const id = `key_sql_${name}`;
  await db.admin`insert into keyward_keys (id, name, digest, created, previous) values (${id}, ${name}, ${tokenDigest(token)}, now(), ${db.admin.json(previous as never)})`;
  return { id, token };
}

test(
  'a key set the gateway could not put in force leaves the store down and is applied again; the version never moves past it',
  { timeout: 60_000 },
  async () => {
    const db = await startDatabase();
    const store = new PgKeyStore(db.url, costRoutes(UPSTREAMS));
    await store.migrate();
    const seen: number[] = [];
    const statuses: boolean[] = [];
    let refuse = false;
    const stop = store.watch(
      (records) => {
        seen.push(records.length);
        if (refuse) throw new Error('cannot apply');
      },
      () => undefined,
      (up) => statuses.push(up),
    );
    try {
      await eventually(() => seen.length >= 1, 5_000, 'first load');
      refuse = true;
      await insertBySql(db, 'one');
      await eventually(() => statuses.includes(false), 5_000, 'reported down after a failed apply');
      // The periodic check succeeds meanwhile, yet the store stays down while the set is not in force.
      await new Promise((r) => setTimeout(r, 2_500));
      assert.deepEqual(statuses, [false]);
      assert.ok(seen.filter((n) => n === 1).length >= 2, `retried: ${JSON.stringify(seen)}`);
      refuse = false;
      await eventually(() => statuses.at(-1) === true, 5_000, 'up once applied');
      assert.equal(seen.at(-1), 1);
    } finally {
      stop();
      await store.close();
      await db.close();
    }
  },
);
