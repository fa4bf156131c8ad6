// SIGHUP (docs/operations.md): configuration, secrets and keys are read again with no
// connection dropped; requests in flight finish on the configuration they
// started with; a bad new configuration keeps the old one serving.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { listeningPort, runCli, startCli } from '../support/cli.ts';
import { startUpstream } from '../support/upstream.ts';

test('SIGHUP applies a new upstream and secret to new requests while one in flight finishes on the old; a bad file changes nothing', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-reload-'));
  let release: () => void = () => undefined;
  const oldUp = await startUpstream((req, res, rec) => {
    if (rec.url === '/v1/slow') {
      res.writeHead(200);
      res.write('first half,');
      release = () => res.end('second half');
      return;
    }
    req.on('end', () => res.end('old'));
  });
  const newUp = await startUpstream((req, res) => req.on('end', () => res.end('new')));
  const configFile = join(dir, 'keyward.env');
  const keyFile = join(dir, 'speech_key');
  writeFileSync(configFile, `# keyward\nKEYWARD_SPEECH_URL=${oldUp.url}\nKEYWARD_LOG_LEVEL=info\n`);
  writeFileSync(keyFile, 'OLDSECRET\n');
  const env = { KEYWARD_PORT: '0', KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_CONFIG_FILE: configFile, KEYWARD_SPEECH_KEY_FILE: keyFile };
  const key = JSON.parse((await runCli(['keys', 'create', '--name', 'r', '--json'], env)).stdout) as { token: string };
  const serve = await startCli(['serve'], env, '"msg":"keyward listening"');
  try {
    const port = listeningPort(serve.output());
    const base = `http://127.0.0.1:${port}`;
    const auth = { authorization: `Bearer ${key.token}` };
    assert.equal((await request(`${base}/speech/v1/x`, { headers: auth })).body.toString(), 'old');
    const inFlight = request(`${base}/speech/v1/slow`, { headers: auth, timeoutMs: 15_000 });
    await eventually(() => oldUp.requests.some((r) => r.url === '/v1/slow'), 3_000, 'slow request upstream');

    writeFileSync(configFile, `KEYWARD_SPEECH_URL=${newUp.url}\nKEYWARD_LOG_LEVEL=info\n`);
    writeFileSync(keyFile, 'NEWSECRET\n');
    serve.child.kill('SIGHUP');
    await eventually(() => serve.output().includes('"msg":"configuration reloaded"'), 5_000, 'reloaded');
    const after = await request(`${base}/speech/v1/x`, { headers: auth });
    assert.equal(after.body.toString(), 'new');
    assert.equal(newUp.requests.at(-1)?.headers['xi-api-key'], 'NEWSECRET');
    release();
    const finished = await inFlight;
    assert.equal(finished.status, 200);
    assert.equal(finished.body.toString(), 'first half,second half', 'the request in flight finished on the old upstream');
    assert.equal(oldUp.requests.find((r) => r.url === '/v1/slow')?.headers['xi-api-key'], 'OLDSECRET');

    // A configuration with problems is not applied; each problem is logged.
    writeFileSync(configFile, `KEYWARD_SPEECH_URL=gopher://nowhere\nKEYWARD_IDLE_TIMEOUT=soon\nnot a line\n`);
    serve.child.kill('SIGHUP');
    await eventually(() => serve.output().includes('"msg":"configuration not reloaded; keeping the running one"'), 5_000, 'refused');
    writeFileSync(configFile, `KEYWARD_SPEECH_URL=gopher://nowhere\nKEYWARD_IDLE_TIMEOUT=soon\n`);
    serve.child.kill('SIGHUP');
    await eventually(() => serve.output().split('"msg":"configuration not reloaded; keeping the running one"').length === 3, 5_000, 'refused again');
    const refused = serve
      .output()
      .split('\n')
      .filter((l) => l.includes('configuration not reloaded'))
      .map((l) => JSON.parse(l) as { problems: string[] });
    assert.match(refused[0]?.problems.join('|') ?? '', /line 3: expected NAME=value/);
    assert.equal(refused[1]?.problems.length, 2, 'every problem is reported');
    assert.ok(refused[1]?.problems.some((p) => p.includes('KEYWARD_SPEECH_URL')));
    assert.ok(refused[1]?.problems.some((p) => p.includes('KEYWARD_IDLE_TIMEOUT')));
    assert.equal((await request(`${base}/speech/v1/x`, { headers: auth })).body.toString(), 'new', 'the running configuration still serves');
    assert.equal(serve.output().includes('NEWSECRET') || serve.output().includes('OLDSECRET'), false);
  } finally {
    serve.child.kill('SIGTERM');
    await deadline(serve.done, 10_000, 'exit');
    await oldUp.close();
    await newUp.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("several credentials: SIGHUP reads each credential's file again; one that disappears keeps the running set serving and names its option, never a value", async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-reload-creds-'));
  const tag = Math.random().toString(36).slice(2, 10);
  // Answers which credential it got (`ONE`, `TWO`, `NEW`): a secret itself would be scrubbed by the egress filter.
  const up = await startUpstream((req, res) => req.on('end', () => res.end(String(req.headers['xi-api-key']).slice(3, 6))));
  const first = join(dir, 'speech_key');
  const second = join(dir, 'speech_key_2');
  writeFileSync(first, `sk_ONE${tag}\n`);
  writeFileSync(second, `sk_TWO${tag}\n`);
  const env = {
    KEYWARD_PORT: '0',
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SPEECH_URL: up.url,
    KEYWARD_SPEECH_KEY_FILE: first,
    KEYWARD_SPEECH_KEY_2_FILE: second,
    KEYWARD_CREDENTIAL_ORDER: 'spread',
    KEYWARD_LOG_LEVEL: 'info',
  };
  const key = JSON.parse((await runCli(['keys', 'create', '--name', 'r', '--json'], env)).stdout) as { token: string };
  const serve = await startCli(['serve'], env, '"msg":"keyward listening"');
  try {
    const port = listeningPort(serve.output());
    const auth = { authorization: `Bearer ${key.token}` };
    // Two requests in a row on `spread` with nothing in flight: one on each credential.
    const both = async (): Promise<string[]> =>
      [
        (await request(`http://127.0.0.1:${port}/speech/v1/x`, { headers: auth })).body.toString(),
        (await request(`http://127.0.0.1:${port}/speech/v1/x`, { headers: auth })).body.toString(),
      ].sort();
    assert.deepEqual(await both(), ['ONE', 'TWO']);

    writeFileSync(second, `sk_NEW${tag}\n`);
    serve.child.kill('SIGHUP');
    await eventually(() => serve.output().includes('"msg":"configuration reloaded"'), 5_000, 'reloaded');
    assert.deepEqual(await both(), ['NEW', 'ONE']);

    rmSync(second);
    serve.child.kill('SIGHUP');
    await eventually(() => serve.output().includes('"msg":"configuration not reloaded; keeping the running one"'), 5_000, 'refused');
    const refused = JSON.parse(
      serve
        .output()
        .split('\n')
        .find((l) => l.includes('configuration not reloaded')) as string,
    ) as { problems: string[] };
    assert.match(refused.problems.join('|'), /KEYWARD_SPEECH_KEY_2_FILE: cannot read/);
    assert.deepEqual(await both(), ['NEW', 'ONE'], 'both credentials still serve');
    for (const s of ['ONE', 'TWO', 'NEW']) assert.equal(serve.output().includes(`sk_${s}${tag}`), false, 'no secret in the log');
  } finally {
    serve.child.kill('SIGTERM');
    await deadline(serve.done, 10_000, 'exit');
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});
