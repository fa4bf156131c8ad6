// docs/credentials.md, "Everywhere the same": a gateway that cannot reach the
// database still applies what it sees itself, says so once, and takes a
// peer's 401 only when it was seen after its own last reload.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { CredentialBoard } from '../../src/request/credentials.ts';
import { shareInFleet } from '../../src/process/credential-share.ts';
import { eventually } from '../support/deadline.ts';

test('the database down: the credential is set aside here all the same, and the failure said once', async () => {
  const board = new CredentialBoard();
  const errors: Error[] = [];
  let asked = 0;
  const stop = shareInFleet(
    board,
    {
      bounded: () => {
        asked++;
        return Promise.reject(new Error('connection refused'));
      },
    },
    () => 0,
    (err) => errors.push(err),
  );
  try {
    const now = Date.now();
    board.setAside({ route: 'speech', label: 2, status: 429, until: now + 60_000 });
    assert.equal(board.available('speech', 2, now), false);
    await eventually(() => asked >= 3, 3_000, 'the write and two reads tried');
    assert.equal(errors.length, 1, 'said once, not once per try');
    assert.match(errors[0]?.message ?? '', /connection refused/);
  } finally {
    stop();
  }
});

test("a peer's rows: applied within a read; a 401 seen before this gateway's last reload is not taken back", async () => {
  const board = new CredentialBoard();
  const reloadedAt = Date.now();
  const rows = [
    { route: 'speech', label: 2, status: 429, until: reloadedAt + 60_000, at: reloadedAt },
    { route: 'speech', label: 3, status: 401, until: Infinity, at: reloadedAt - 5_000 },
    { route: 'speech', label: 4, status: 401, until: Infinity, at: reloadedAt + 1 },
  ];
  const stop = shareInFleet(
    board,
    { bounded: <T>() => Promise.resolve(rows as unknown as T) },
    () => reloadedAt,
    () => undefined,
  );
  try {
    await eventually(() => !board.available('speech', 2, Date.now()), 2_000, 'the peer’s 429 applied');
    assert.equal(board.available('speech', 3, Date.now()), true, 'an old 401: this gateway reloaded since');
    assert.equal(board.available('speech', 4, Date.now()), false, 'a 401 after the reload');
  } finally {
    stop();
  }
});
