// The PostgreSQL driver drops the promise of its own first query on every
// new connection (postgres.js fetches the server's array types there and
// leaves a failure unhandled: porsager/postgres#1192). A connection lost at
// that moment (a pool replaced past its deadline, a server stopping, an
// administrator's pg_terminate_backend) killed the gateway: under stress-ng
// the test "the database path of every gateway frozen past the lease TTL"
// lost a gateway 3 times in 18 runs. A statement timeout of 1 ms set at
// connection start cancels that query every time, so the fault is met at
// once: the gateway says so and keeps serving what it can (503 while it has
// no key set), instead of ending.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { eventually } from '../support/deadline.ts';
import { startFleetGateway, statusOf, type FleetGateway } from '../support/fleet.ts';
import { startDatabase } from '../support/postgres.ts';

test('a connection the driver loses while setting it up neither ends the gateway nor goes unsaid', { timeout: 60_000 }, async () => {
  const db = await startDatabase();
  let g: FleetGateway | null = null;
  try {
    const url = new URL(db.url);
    // Every statement on a new connection, the driver's own first included, is cancelled (57014).
    url.searchParams.set('options', '-c statement_timeout=1');
    g = await startFleetGateway({
      KEYWARD_DATABASE_URL: url.toString(),
      KEYWARD_DATABASE_TIMEOUT: '1s',
      KEYWARD_ADMIN_PORT: 'off',
      KEYWARD_SEO_URL: 'http://127.0.0.1:1',
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
    });
    const gw = g;
    await eventually(() => gw.errors().includes('lost while the driver set it up'), 15_000, 'the driver to lose a connection it set up');
    // Still serving: no key set could be read, so 503, not a closed port.
    for (let i = 0; i < 3; i++) assert.equal(await statusOf(gw.base, 'kw_unused'), 503);
    assert.doesNotMatch(gw.errors(), /unexpected failure/);
  } finally {
    await g?.stop().catch(() => g?.kill());
    await db.close();
  }
});
