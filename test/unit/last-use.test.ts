// Last use is gathered in memory and written in batches: never a store write per request.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { LastUse } from '../../src/keys/last-use.ts';
import type { KeyStore } from '../../src/keys/store.ts';

function recordingStore(): { store: KeyStore; writes: Array<Map<string, number>> } {
  const writes: Array<Map<string, number>> = [];
  const store = {
    location: 'memory',
    load: async () => [],
    watch: () => () => undefined,
    update: async () => undefined as never,
    recordUse: async (uses: ReadonlyMap<string, number>) => void writes.push(new Map(uses)),
    lastUse: async () => new Map(),
    auditEntries: async () => [],
    auditHead: async () => null,
    admins: async () => [],
    updateAdmins: async () => undefined as never,
  } satisfies KeyStore;
  return { store, writes };
}

test('ten thousand uses of three keys become one write holding each key once, with its latest time', async () => {
  const { store, writes } = recordingStore();
  const lastUse = new LastUse(store, 60_000, (err) => assert.fail(err));
  for (let i = 0; i < 10_000; i++) lastUse.touch(`key_${i % 3}`, 1_000 + i);
  assert.equal(writes.length, 0, 'nothing is written on the request path');
  await lastUse.flush();
  assert.equal(writes.length, 1);
  assert.deepEqual(
    writes[0],
    new Map([
      ['key_0', 10_999],
      ['key_1', 10_997],
      ['key_2', 10_998],
    ]),
  );
  await lastUse.flush();
  assert.equal(writes.length, 1, 'an empty batch writes nothing');
  lastUse.touch('key_9', 5);
  await lastUse.stop();
  assert.equal(writes.length, 2, 'stop writes what is left');
});
