// Hardening, round 2. A client-chosen 16 KiB path made a 16 KiB log line (docs/logs.md): paths
// are cut in the log with their length recorded.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw, statusLines } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('a log line stays a few hundred bytes whatever the path: long paths are cut with their length recorded', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  try {
    const long = `/seo/${'a'.repeat(16_000)}`;
    const out = await raw(gw.port, `GET ${long} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n`);
    assert.deepEqual(statusLines(out), ['HTTP/1.1 401 Unauthorized']);
    await eventually(() => gw.logs().some((l) => l.msg === 'request completed'), 2_000, 'logged');
    const line = gw.logs().find((l) => l.msg === 'request completed') as { path: string };
    assert.equal(line.path, `/seo/${'a'.repeat(195)}…[${long.length} chars]`);
    // A few hundred bytes: the line's other fields (timings, ids) vary in length with the machine's load, never by kilobytes.
    assert.ok(JSON.stringify(line).length < 1_024, `line is ${JSON.stringify(line).length} bytes`);
  } finally {
    await gw.close();
    await up.close();
  }
});
