// Hardening, round 2: edge cases an attacker found, each over real sockets.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { raw, statusLines } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('Expect other than 100-continue goes through the gateway: 401 without a token, 417 JSON with one, logged and never forwarded', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  try {
    const anon = await raw(gw.port, 'POST /seo/v3/x HTTP/1.1\r\nhost: x\r\nexpect: 200-ok\r\ncontent-length: 0\r\nconnection: close\r\n\r\n');
    assert.match(anon, /^HTTP\/1\.1 401 /);
    assert.match(anon, /\{"error":"Unauthorized\.","code":"unauthorized"\}$/);
    const authed = await raw(gw.port, `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\nexpect: 200-ok\r\nauthorization: Bearer ${gw.token}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n`);
    assert.match(authed, /^HTTP\/1\.1 417 /);
    assert.match(authed, /content-type: application\/json/i);
    assert.match(authed, /\{"error":"Only Expect: 100-continue is supported\.","code":"expectation_failed"\}$/);
    assert.equal(up.requests.length, 0);
    await eventually(() => gw.logs().filter((l) => l.msg === 'request completed').length === 2, 2_000, 'two log lines');
    const statuses = gw.logs().filter((l) => l.msg === 'request completed').map((l) => l.status);
    assert.deepEqual(statuses, [401, 417]);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('paths with encoded control characters, %u escapes, overlong UTF-8 or dots with encoded blanks are refused with 400 before forwarding', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  try {
    const refused = ['/seo/..%00/x', '/seo/..%20/x', '/seo/%c0%ae%c0%ae/x', '/seo/%C0%AF', '/seo/%u002e%u002e/x', '/seo/.%00./x', '/seo/a%0d%0aSet-Cookie:x', '/seo/a%7F', '/seo/%e0%80%af', '/seo/%f0%80%80%af', '/seo/%2e%09/x'];
    for (const path of refused) {
      const out = await raw(gw.port, `GET ${path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nconnection: close\r\n\r\n`);
      assert.match(out, /^HTTP\/1\.1 400 /, path);
      assert.match(out, /"code":"bad_request"/, path);
    }
    assert.equal(up.requests.length, 0, 'none reached the upstream');
    // What stays allowed: ordinary escapes, encoded slashes, UTF-8, spaces inside names.
    for (const path of ['/seo/a%20b', '/seo/a%2Fb', '/seo/%e2%82%ac', '/seo/..%20x', '/seo/%41']) {
      const out = await raw(gw.port, `GET ${path} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nconnection: close\r\n\r\n`);
      assert.match(out, /^HTTP\/1\.1 200 /, path);
    }
    assert.deepEqual(up.requests.map((r) => r.url), ['/a%20b', '/a%2Fb', '/%e2%82%ac', '/..%20x', '/%41']);
  } finally {
    await gw.close();
    await up.close();
  }
});

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
    assert.ok(JSON.stringify(line).length < 600, `line is ${JSON.stringify(line).length} bytes`);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('a FIFO in place of the keys file is refused and logged; the last good set serves and SIGTERM still stops the gateway', { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-fifo-'));
  const up = await startUpstream();
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: 'off', KEYWARD_SEO_URL: up.url, KEYWARD_SEO_LOGIN: 'l', KEYWARD_SEO_PASSWORD: 'p' };
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'f', '--json'], env)).stdout) as { token: string };
    const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
    try {
      const port = (JSON.parse(gw.output().split('\n').find((l) => l.includes('"msg":"keyward listening"')) as string) as { port: number }).port;
      const fifo = join(dir, 'fifo');
      execFileSync('mkfifo', [fifo]);
      renameSync(fifo, env.KEYWARD_KEYS_FILE);
      await eventually(() => gw.output().includes('is not a regular file'), 5_000, 'refusal logged');
      const out = await raw(port, `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${key.token}\r\nconnection: close\r\n\r\n`);
      assert.match(out, /^HTTP\/1\.1 200 /, 'the last good set serves');
      await new Promise((r) => setTimeout(r, 600));
      assert.equal(gw.output().split('\n').filter((l) => l.includes('is not a regular file')).length, 1, 'logged once, not on every poll');
    } finally {
      gw.child.kill('SIGTERM');
      const result = await deadline(gw.done, 10_000, 'exit after SIGTERM');
      assert.equal(result.code, 0);
    }
  } finally {
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('protected headers are matched with `_` as `-`: credentials in any spelling removed, method overrides in any spelling refused', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ speech: up.url, seo: up.url });
  try {
    const override = await raw(gw.port, `POST /seo/v3/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nX_HTTP_Method_Override: DELETE\r\ncontent-length: 0\r\nconnection: close\r\n\r\n`);
    assert.match(override, /^HTTP\/1\.1 404 /);
    assert.match(override, /"error":"Method overrides are not allowed\."/);
    assert.equal(up.requests.length, 0);
    const sent = await raw(
      gw.port,
      `GET /speech/v1/user HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${gw.token}\r\nxi_api_key: client-supplied\r\nXI_API_KEY: other\r\ncontent_length: 5\r\nkeep_alive: x\r\nx_custom: kept\r\nconnection: close\r\n\r\n`,
    );
    assert.match(sent, /^HTTP\/1\.1 200 /);
    const seen = up.requests[0] as { headers: Record<string, string | string[] | undefined> };
    assert.equal(seen.headers['xi-api-key'], gw.secrets.speechKey, 'only the injected credential');
    for (const h of ['xi_api_key', 'content_length', 'keep_alive']) assert.equal(seen.headers[h], undefined, h);
    assert.equal(seen.headers.x_custom, 'kept', 'other underscore names pass');
  } finally {
    await gw.close();
    await up.close();
  }
});
