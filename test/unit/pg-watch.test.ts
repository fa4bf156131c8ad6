// The key watch's steps (keys/pg-watch.ts, keys/held.ts) driven without a
// database (docs/fleet.md, "How a change travels"): a full reload after
// every (re)subscribe, increments on a notice, the once-a-second check
// fetching what a notice missed, a reconnect after a failed subscribe, a
// replaced pool, a sequence set back, a census that disagrees, and a set
// not put in force read again in full.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { heldAfter, heldFrom } from '../../src/keys/held.ts';
import type { KeyRecord } from '../../src/keys/keyset.ts';
import type { Row } from '../../src/keys/pg-schema.ts';
import { reconnectDelayMs, TableWatch, type Mark, type Source } from '../../src/keys/pg-watch.ts';
import type { Tombstone } from '../../src/keys/held.ts';

const digest = (n: number): string => `sha256:${n.toString(16).padStart(64, '0')}`;
const row = (id: string, version: number, extra: Partial<Row> = {}): Row => ({
  id,
  name: id,
  digest: digest(version),
  created: 1_700_000_000,
  expires: null,
  revoked: null,
  routes: null,
  previous: [],
  limits: null,
  version: String(version),
  h: String(version * 7919),
  ...extra,
});

/** A table in memory, with the calls the watch makes on it recorded. */
class Table implements Source {
  readonly costRoutes = ['seo'];
  rows = new Map<string, Row>();
  dead: Tombstone[] = [];
  seq = 0n;
  poolId = { n: 0 };
  calls: string[] = [];
  listenFails = 0;
  unlistened = 0;
  onNotice: ((payload: string) => void) | null = null;
  onListen: (() => void) | null = null;
  top(): bigint {
    return [...[...this.rows.values()].map((r) => BigInt(r.version)), ...this.dead.map((d) => BigInt(d.version)), 0n].reduce((a, b) => (a > b ? a : b));
  }
  write(id: string, extra: Partial<Row> = {}): void {
    this.seq += 1n;
    this.rows.set(id, row(id, Number(this.seq), extra));
  }
  remove(id: string): void {
    this.seq += 1n;
    this.rows.delete(id);
    this.dead.push({ id, version: String(this.seq) });
  }
  pool(): object {
    return this.poolId;
  }
  listen(onNotice: (payload: string) => void, onListen: () => void): Promise<{ unlisten(): Promise<void> }> {
    this.calls.push('listen');
    if (this.listenFails > 0) {
      this.listenFails--;
      return Promise.reject(new Error('connect ECONNREFUSED'));
    }
    this.onNotice = onNotice;
    this.onListen = onListen;
    onListen();
    return Promise.resolve({ unlisten: () => Promise.resolve(void this.unlistened++) });
  }
  readAll(): Promise<{ rows: Row[]; mark: Mark }> {
    this.calls.push('all');
    return Promise.resolve({ rows: [...this.rows.values()], mark: { top: this.top(), seq: this.seq } });
  }
  readSince(from: bigint): Promise<{ rows: Row[]; dead: Tombstone[] }> {
    this.calls.push(`since ${from}`);
    const above = <T extends { version: string }>(xs: Iterable<T>): T[] => [...xs].filter((x) => BigInt(x.version) > from);
    return Promise.resolve({ rows: above(this.rows.values()), dead: above(this.dead) });
  }
  readMark(): Promise<Mark> {
    this.calls.push('mark');
    return Promise.resolve({ top: this.top(), seq: this.seq });
  }
  readCensus(): Promise<{ top: bigint; n: number; sum: bigint }> {
    this.calls.push('census');
    return Promise.resolve({ top: this.top(), n: this.rows.size, sum: [...this.rows.values()].reduce((s, r) => s + BigInt(r.h), 0n) });
  }
}

const flush = (): Promise<void> => new Promise((r) => setImmediate(r));

function start(table: Table, handlers: { onChange?: (records: readonly KeyRecord[]) => void } = {}) {
  const sets: string[][] = [];
  const events: string[] = [];
  const watch = new TableWatch(table, {
    onChange: (records) => {
      handlers.onChange?.(records);
      sets.push(records.map((r) => r.id));
    },
    onError: (err) => events.push(`error ${err.message}`),
    onStatus: (up) => events.push(up ? 'up' : 'down'),
    onInvalid: (invalid) => events.push(`invalid ${[...invalid.keys()].join(',')}`),
    onWarning: (message) => events.push(`warning ${message.slice(0, 30)}`),
  });
  watch.subscribe();
  return { watch, sets, events };
}

test('subscribing reads the whole table; a notice fetches only what changed, in version order', async () => {
  const table = new Table();
  table.write('a');
  table.write('b');
  const { watch, sets } = start(table);
  await flush();
  await watch.settled();
  assert.deepEqual(sets, [['a', 'b']]);
  table.write('c');
  table.remove('a');
  table.write('a'); // deleted and created again: present, at the end
  table.onNotice?.(JSON.stringify({ version: String(table.seq), ids: ['c', 'a'] }));
  await watch.settled();
  assert.deepEqual(sets.at(-1), ['b', 'c', 'a']);
  assert.deepEqual(table.calls, ['listen', 'all', 'since 2']);
  // A notice for a version already held fetches nothing.
  table.onNotice?.(JSON.stringify({ version: '3', ids: ['c'] }));
  await watch.settled();
  assert.equal(table.calls.length, 3);
  assert.equal(watch.held.version, table.seq);
});

test('the held checksum and count follow every increment, so a census at the same version agrees', async () => {
  const table = new Table();
  for (const id of ['a', 'b', 'c']) table.write(id);
  const { watch } = start(table);
  await flush();
  table.write('b', { name: 'renamed' });
  table.remove('c');
  table.write('d');
  table.onNotice?.('{"version":"6"}');
  await watch.settled();
  const census = await table.readCensus();
  assert.equal(watch.held.sum, census.sum);
  assert.equal(watch.held.records.length, census.n);
  assert.deepEqual(heldFrom([...table.rows.values()], table.top(), table.costRoutes).sum, watch.held.sum);
});

test('a row that fails the check opens nothing and is reported; fixed, it comes back', async () => {
  const table = new Table();
  table.write('a');
  table.write('bad', { digest: 'md5:nope' });
  const { watch, sets, events } = start(table);
  await flush();
  await watch.settled();
  assert.deepEqual(sets, [['a']]);
  assert.deepEqual(events, ['invalid bad']);
  table.write('a', { digest: 'not a digest' });
  table.write('bad');
  table.onNotice?.('{"version":"4"}');
  await watch.settled();
  assert.deepEqual(sets.at(-1), ['bad']);
  assert.deepEqual(events.at(-1), 'invalid a');
});

test('the check fetches a change whose notice was lost, and every tenth compares a census', async () => {
  const table = new Table();
  table.write('a');
  const { watch, sets } = start(table);
  await flush();
  table.write('b'); // no notice
  watch.tick();
  await flush();
  await watch.settled();
  assert.deepEqual(sets.at(-1), ['a', 'b']);
  // A change made with the triggers off: same version, other rows.
  table.rows.set('a', { ...row('a', 1), name: 'by hand', h: '12345' });
  for (let i = 2; i <= 10; i++) {
    watch.tick();
    await flush();
  }
  await flush();
  await watch.settled();
  assert.equal(table.calls.filter((c) => c === 'census').length, 1);
  assert.equal(table.calls.filter((c) => c === 'all').length, 2, 'the census disagreed: read again in full');
  assert.equal(watch.held.records.find((r) => r.id === 'a')?.name, 'by hand');
});

test('a failed subscribe reports down and tries again after the backoff; a replaced pool subscribes again', async () => {
  const table = new Table();
  table.write('a');
  table.listenFails = 2;
  const { watch, sets, events } = start(table);
  const deadline = Date.now() + 5_000;
  while (sets.length === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 10));
  await watch.settled();
  assert.deepEqual(table.calls.slice(0, 4), ['listen', 'listen', 'listen', 'all']);
  assert.deepEqual(events, ['down', 'up']);
  assert.deepEqual(sets, [['a']]);
  table.poolId = { n: 1 };
  watch.tick();
  await flush();
  await watch.settled();
  assert.equal(table.calls.filter((c) => c === 'listen').length, 4);
  assert.equal(table.calls.filter((c) => c === 'all').length, 2, 'every (re)subscribe reloads in full');
  watch.stop();
  assert.equal(table.unlistened, 1);
});

test('a set onChange refuses is not in force: the next check reads everything again', async () => {
  const table = new Table();
  table.write('a');
  let refuse = false;
  const { watch, events } = start(table, {
    onChange: () => {
      if (refuse) throw new Error('refused');
    },
  });
  await flush();
  await watch.settled();
  refuse = true;
  table.write('b');
  table.onNotice?.('{"version":"2"}');
  await watch.settled();
  assert.deepEqual(
    watch.held.records.map((r) => r.id),
    ['a'],
  );
  assert.deepEqual(events, ['down', 'error refused']);
  refuse = false;
  watch.tick();
  await flush();
  await watch.settled();
  assert.deepEqual(
    watch.held.records.map((r) => r.id),
    ['a', 'b'],
  );
  assert.equal(table.calls.filter((c) => c === 'all').length, 2);
  assert.equal(events.at(-1), 'up');
});

test('a version sequence set back is warned of once and each change below it read in full', async () => {
  const table = new Table();
  table.write('a');
  table.write('b');
  const { watch, events } = start(table);
  await flush();
  await watch.settled();
  table.seq = 0n; // setval
  watch.tick();
  await flush();
  await watch.settled();
  assert.deepEqual(events.filter((e) => e.startsWith('warning')).length, 1);
  const reads = table.calls.filter((c) => c === 'all').length;
  assert.equal(reads, 2, 'read again in full at the first sight of it');
  table.write('c'); // version 1: below the highest held
  table.onNotice?.('{"version":"1"}');
  await watch.settled();
  assert.ok(watch.held.records.some((r) => r.id === 'c'));
  watch.tick();
  await flush();
  assert.equal(events.filter((e) => e.startsWith('warning')).length, 1, 'said once per occurrence');
});

test('heldAfter leaves what is held alone when nothing changed', () => {
  const held = heldFrom([row('a', 1)], 1n, []);
  assert.equal(heldAfter(held, [], [], []), held);
});

test('reconnect delays double from 50 ms to a second, drawn from their upper half', () => {
  assert.equal(
    reconnectDelayMs(0, () => 0),
    25,
  );
  assert.equal(
    reconnectDelayMs(0, () => 1),
    50,
  );
  assert.equal(
    reconnectDelayMs(3, () => 1),
    400,
  );
  assert.equal(
    reconnectDelayMs(10, () => 0),
    500,
  );
  assert.equal(
    reconnectDelayMs(10, () => 1),
    1_000,
  );
});
