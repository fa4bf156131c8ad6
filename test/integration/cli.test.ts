// bin/keyward end to end (docs/cli.md): keys management, serve, demo, exit codes.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, mkdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { promisify } from 'node:util';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { startUpstream } from '../support/upstream.ts';

const exec = promisify(execFile);

function tempDir(): string {
  return mkdtempSync(join(tmpdir(), 'keyward-cli-'));
}

test('keys create, list and revoke: the token is shown once and stored only as a digest', async () => {
  const dir = tempDir();
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const created = await runCli(['keys', 'create', '--name', 'alice', '--expires-in', '30d', '--json'], env);
    assert.equal(created.code, 0, created.stderr);
    const key = JSON.parse(created.stdout) as { id: string; name: string; token: string; expires: string };
    assert.match(key.token, /^kw_[0-9A-Za-z]{49}$/);
    assert.equal(key.name, 'alice');
    assert.ok(Math.abs(Date.parse(key.expires) - Date.now() - 30 * 86_400_000) < 60_000);
    const text = await runCli(['keys', 'create', '--name', 'bob'], env);
    assert.equal(text.code, 0);
    assert.match(text.stdout, /^Created key key_[0-9a-f]{12} \(name bob, routes all, expires never\)\.\nToken .*\nkw_[0-9A-Za-z]{49}\n$/);

    const file = readFileSync(env.KEYWARD_KEYS_FILE, 'utf8');
    assert.equal(file.includes(key.token), false);
    assert.match(file, /"digest":"sha256:[0-9a-f]{64}"/);
    assert.equal(statSync(env.KEYWARD_KEYS_FILE).mode & 0o777, 0o600);

    const list = await runCli(['keys', 'list', '--json'], env);
    const rows = JSON.parse(list.stdout) as Array<Record<string, unknown>>;
    assert.deepEqual(
      rows.map((r) => r.name),
      ['alice', 'bob'],
    );
    assert.equal(list.stdout.includes('kw_') || list.stdout.includes('sha256'), false);
    const table = await runCli(['keys', 'list'], env);
    assert.match(table.stdout, /^ID\s+NAME\s+ROUTES\s+CREATED\s+EXPIRES\s+REVOKED\s+LAST USED\n/);
    assert.equal(table.stdout.includes('kw_'), false);

    const revoked = await runCli(['keys', 'revoke', 'alice'], env);
    assert.equal(revoked.code, 0);
    assert.match(revoked.stdout, new RegExp(`Revoked key ${key.id}`));
    const after = JSON.parse((await runCli(['keys', 'list', '--json'], env)).stdout) as Array<{ name: string; revoked: string | null }>;
    assert.notEqual(after.find((r) => r.name === 'alice')?.revoked, null);
    // the name is free again once revoked
    assert.equal((await runCli(['keys', 'create', '--name', 'alice'], env)).code, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('usage and configuration errors exit 2 with a one-line reason; runtime failures exit 1', async () => {
  const dir = tempDir();
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const cases: Array<[string[], number, RegExp]> = [
      [[], 2, /a command is required/],
      [['frobnicate'], 2, /^keyward: unknown command frobnicate$/],
      [['serv'], 2, /unknown command serv; did you mean serve\?/],
      [['keys', 'crate', '--name', 'x'], 2, /unknown keys command crate; did you mean create\?/],
      [['keys'], 2, /keys needs a command: create, list, revoke, rotate, update, import or export/],
      [['keys', 'create'], 2, /needs --name/],
      [['keys', 'create', '--name', 'x', '--expires-in', 'soon'], 2, /--expires-in/],
      [['keys', 'create', '--name', 'bad name'], 2, /--name must be/],
      [['keys', 'create', '--name', 'x', '--colour'], 2, /Unknown option '--colour'/],
      [['keys', 'revoke', 'nobody'], 2, /no key with id or name nobody/],
      [['keys', 'revoke'], 2, /needs ID or NAME/],
      [['serve', 'extra'], 2, /Unexpected argument 'extra'/],
    ];
    for (const [args, code, reason] of cases) {
      const r = await runCli(args, env);
      assert.equal(r.code, code, args.join(' '));
      // keys commands that got as far as a store name it first
      const first = r.stderr.split('\n').filter((l) => !l.startsWith('keyward: keys file /'))[0] ?? '';
      assert.match(first, reason, args.join(' '));
    }
    assert.equal((await runCli(['help'], env)).code, 0);
    // What is installed, after an upgrade: the package's own version.
    const installed = (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;
    for (const args of [['--version'], ['version']]) {
      const v = await runCli(args, env);
      assert.equal(v.code, 0, args.join(' '));
      assert.equal(v.stdout, `keyward ${installed}\n`);
    }
    // `keys help` is the keys help, not an unknown command; `keys help create` the create help.
    const keysHelp = await runCli(['keys', 'help'], env);
    assert.equal(keysHelp.code, 0);
    assert.match(keysHelp.stdout, /^usage: keyward keys </);
    assert.equal(keysHelp.stderr, '');
    assert.match((await runCli(['keys', 'help', 'create'], env)).stdout, /^usage: keyward keys create --name NAME/);
    assert.equal((await runCli(['keys', 'create', '--name', 'dup'], env)).code, 0);
    assert.match((await runCli(['keys', 'create', '--name', 'dup'], env)).stderr, /already exists/);

    writeFileSync(env.KEYWARD_KEYS_FILE, '{broken');
    const corrupt = await runCli(['keys', 'list'], env);
    assert.equal(corrupt.code, 1);
    assert.equal(corrupt.stderr, `keyward: keys file ${env.KEYWARD_KEYS_FILE}\nkeyward: keys file: not valid JSON at line 1, column 2\n`);

    const config = await runCli(['serve'], {
      ...env,
      KEYWARD_PORT: 'eighty',
      KEYWARD_SEO_URL: 'gopher://x',
      KEYWARD_SPEECH_KEY: 'SECRETVALUE',
      KEYWARD_SPEECH_KEY_FILE: '/x',
    });
    assert.equal(config.code, 2);
    const lines = config.stderr.trim().split('\n');
    assert.equal(lines.length, 3);
    for (const name of ['KEYWARD_PORT', 'KEYWARD_SEO_URL', 'KEYWARD_SPEECH_KEY'])
      assert.ok(
        lines.some((l) => l.includes(name)),
        name,
      );
    assert.equal(config.stderr.includes('SECRETVALUE'), false);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("concurrent keys create runs never lose each other's keys", async () => {
  const dir = tempDir();
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const runs = await Promise.all(Array.from({ length: 8 }, (_, i) => runCli(['keys', 'create', '--name', `k${i}`, '--json'], env, undefined, 60_000)));
    for (const r of runs) assert.equal(r.code, 0, r.stderr);
    const names = (JSON.parse((await runCli(['keys', 'list', '--json'], env)).stdout) as Array<{ name: string }>).map((r) => r.name).sort();
    assert.deepEqual(names, ['k0', 'k1', 'k2', 'k3', 'k4', 'k5', 'k6', 'k7']);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('serve: secrets from files and systemd credentials, live reload, SIGHUP, clean SIGTERM', async () => {
  const dir = tempDir();
  const up = await startUpstream();
  try {
    const creds = join(dir, 'creds');
    mkdirSync(creds);
    writeFileSync(join(creds, 'keyward_speech_key'), 'SPEECHFROMCREDS\n');
    writeFileSync(join(dir, 'seo-password'), 'SEOPASSFROMFILE\n');
    const env = {
      KEYWARD_PORT: '0',
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      KEYWARD_SPEECH_URL: up.url,
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'me',
      KEYWARD_SEO_PASSWORD_FILE: join(dir, 'seo-password'),
      CREDENTIALS_DIRECTORY: creds,
    };
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'svc', '--json'], env)).stdout) as { token: string };
    const serve = await startCli(['serve'], env, '"msg":"keyward listening"');
    const started = JSON.parse(serve.output().split('\n')[0] ?? '{}') as { port: number; routes: string[]; disabledRoutes: string[] };
    assert.deepEqual(started.routes, ['seo', 'speech']);
    assert.deepEqual(started.disabledRoutes, ['scraper']);
    const base = `http://127.0.0.1:${started.port}`;
    const auth = { authorization: `Bearer ${key.token}` };
    assert.equal((await request(`${base}/speech/v1/voices`, { headers: auth })).status, 200);
    assert.equal(up.requests[0]?.headers['xi-api-key'], 'SPEECHFROMCREDS');
    assert.equal((await request(`${base}/seo/v3/x`, { headers: auth })).status, 200);
    assert.equal(up.requests[1]?.headers.authorization, `Basic ${Buffer.from('me:SEOPASSFROMFILE').toString('base64')}`);
    assert.equal((await request(`${base}/scraper/v2/x`, { method: 'POST', headers: auth })).status, 503);

    // revoke through the CLI: refused within a second, no restart
    assert.equal((await runCli(['keys', 'revoke', 'svc'], env)).code, 0);
    await eventually(async () => (await request(`${base}/seo/v3/x`, { headers: auth })).status === 401, 1_000, 'revocation');

    serve.child.kill('SIGHUP');
    await eventually(() => serve.output().includes('"msg":"keys reloaded"'), 2_000, 'SIGHUP reload');
    serve.child.kill('SIGTERM');
    const result = await deadline(serve.done, 10_000, 'exit after SIGTERM');
    assert.equal(result.code, 0);
    assert.match(result.stdout, /"msg":"stopped"/);
    for (const secret of ['SPEECHFROMCREDS', 'SEOPASSFROMFILE', key.token])
      assert.equal(result.stdout.includes(secret) || result.stderr.includes(secret), false);
  } finally {
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('serve with KEYWARD_WORKERS=2: both workers serve, logs stay whole lines, SIGHUP reaches both, SIGTERM drains both', async () => {
  const dir = tempDir();
  const up = await startUpstream();
  try {
    const env = {
      KEYWARD_PORT: '0',
      KEYWARD_WORKERS: '2',
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'me',
      KEYWARD_SEO_PASSWORD: 'pw',
    };
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'svc', '--json'], env)).stdout) as { token: string };
    const serve = await startCli(['serve'], env, '"msg":"keyward listening"');
    await eventually(() => serve.output().split('"msg":"keyward listening"').length === 3, 10_000, 'two workers listening');
    const listening = serve
      .output()
      .split('\n')
      .filter((l) => l.includes('keyward listening'))
      .map((l) => JSON.parse(l) as { pid: number; port: number });
    assert.equal(new Set(listening.map((l) => l.pid)).size, 2);
    assert.equal(new Set(listening.map((l) => l.port)).size, 1, 'one shared port');
    const base = `http://127.0.0.1:${listening[0]?.port}`;
    const replies = await Promise.all(Array.from({ length: 20 }, () => request(`${base}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } })));
    for (const r of replies) assert.equal(r.status, 200);
    serve.child.kill('SIGHUP');
    await eventually(() => serve.output().split('"msg":"keys reloaded"').length === 3, 3_000, 'both workers reloaded');
    serve.child.kill('SIGTERM');
    const result = await deadline(serve.done, 10_000, 'exit after SIGTERM');
    assert.equal(result.code, 0);
    const lines = result.stdout.trim().split('\n');
    for (const l of lines) JSON.parse(l); // every relayed line is one whole JSON document
    const served = lines.map((l) => JSON.parse(l) as { msg: string; pid: number }).filter((l) => l.msg === 'request completed');
    assert.equal(served.length, 20);
    assert.equal(lines.filter((l) => l.includes('"msg":"stopped"')).length, 2);
  } finally {
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('serve with workers: a worker that cannot start stops the service instead of looping', async () => {
  const dir = tempDir();
  const up = await startUpstream();
  try {
    const r = await runCli(['serve'], { KEYWARD_PORT: new URL(up.url).port, KEYWARD_WORKERS: '2', KEYWARD_KEYS_FILE: join(dir, 'keys.json') });
    assert.equal(r.code, 1);
    assert.match(r.stderr, /EADDRINUSE/);
  } finally {
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('serve: a port already in use is a runtime failure (exit 1)', async () => {
  const dir = tempDir();
  const up = await startUpstream();
  try {
    const port = new URL(up.url).port;
    const r = await runCli(['serve'], { KEYWARD_PORT: port, KEYWARD_KEYS_FILE: join(dir, 'keys.json') });
    assert.equal(r.code, 1);
    assert.match(r.stderr, /cannot start: .*EADDRINUSE/);
  } finally {
    await up.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test(
  'demo: every curl command it prints works as printed',
  {
    skip: process.env.PATH?.split(':').some((p) => {
      try {
        return statSync(join(p, 'curl')).isFile();
      } catch {
        return false;
      }
    })
      ? false
      : 'curl is not installed',
  },
  async () => {
    const dir = tempDir();
    const demo = await startCli(['demo'], { KEYWARD_PORT: '0', KEYWARD_ADMIN_PORT: '0' }, 'Ctrl-C stops the demo.', 'stdout', dir);
    try {
      const commands = demo
        .output()
        .split('\n')
        .filter((l) => l.startsWith('curl '));
      assert.equal(commands.length, 10);
      const outputs: string[] = [];
      for (const command of commands.slice(0, 7)) {
        const { stdout } = await deadline(exec('sh', ['-c', command], { cwd: dir, encoding: 'utf8' }), 15_000, command);
        outputs.push(stdout);
      }
      assert.equal((JSON.parse(outputs[0] ?? '') as { data: { status: string } }).data.status, 'READY');
      assert.equal((JSON.parse(outputs[1] ?? '') as { status_code: number }).status_code, 20000);
      assert.equal(statSync(join(dir, 'hello.mp3')).size, 32_768);
      assert.equal(statSync(join(dir, 'stream.mp3')).size, 65_536);
      assert.deepEqual(JSON.parse(outputs[4] ?? ''), { error: 'Unauthorized.', code: 'unauthorized' });
      // The budgeted key: the stand-in bills 18 characters for "Hello from keyward", over a budget of 10.
      assert.equal(statSync(join(dir, 'budget-hello.mp3')).size, 32_768);
      assert.equal((JSON.parse(outputs[6] ?? '') as { code: string }).code, 'budget_exceeded');
      // The scraper's budget (0.5 usd a day, runs of 0.3 booked once they end): two runs, each waited for until
      // booked (the key's status), then the third is refused. The second was capped at the 0.2 left, and cost that.
      const [run, status, readyz] = commands.slice(7) as [string, string, string];
      // The lines to paste: the demo's keys file for the CLI, and its admin listener with the usage page.
      const exported = /^export KEYWARD_KEYS_FILE='([^']+)'$/m.exec(demo.output())?.[1] as string;
      const tried = await runCli(['keys', 'create', '--name', 'tried', '--quota', '3/day', '--json'], { KEYWARD_KEYS_FILE: exported });
      assert.equal(tried.code, 0, tried.stderr);
      const triedToken = (JSON.parse(tried.stdout) as { token: string }).token;
      const base = /gateway on (http:\/\/\S+),/.exec(demo.output())?.[1] as string;
      await eventually(
        async () =>
          (await exec('sh', ['-c', `curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer ${triedToken}' ${base}/seo/v3/appendix/user_data`]))
            .stdout === '200',
        5_000,
        'a key made with the pasted line works at once',
      );
      assert.equal((JSON.parse((await exec('sh', ['-c', readyz])).stdout) as { ready: boolean }).ready, true);
      const usage = /usage page \(what each key forwarded and spent\): (\S+)$/m.exec(demo.output())?.[1] as string;
      // The ledger writes its counts in batches: the key's request shows once they are in.
      await eventually(async () => (await exec('sh', ['-c', `curl -s ${usage}`])).stdout.includes('tried'), 15_000, 'the key on the usage page');
      const scraperUsed = async (): Promise<number> => {
        const s = JSON.parse((await exec('sh', ['-c', status], { cwd: dir, encoding: 'utf8' })).stdout) as {
          limits: Array<{ kind: string; route: string | null; used: number }>;
        };
        return s.limits.find((l) => l.kind === 'budget' && l.route === 'scraper')?.used ?? -1;
      };
      // Two speech credentials, the first busy on one request in three: the printed loop gets 200 every time,
      // and each 429 it met was retried on credential 2 (a line here, the request line on stderr).
      const [loop, burst] = demo
        .output()
        .split('\n')
        .filter((l) => l.startsWith('for i in ')) as [string, string];
      for (let round = 0; round < 2; round++) {
        const codes = (await deadline(exec('sh', ['-c', loop], { cwd: dir, encoding: 'utf8' }), 15_000, loop)).stdout;
        assert.deepEqual(codes.trim().split('\n'), ['200', '200', '200', '200', '200', '200']);
      }
      // Each account takes two at once: a burst of six two-second streams waits its turn, and every one gets 200.
      const burstCodes = (await deadline(exec('sh', ['-c', burst], { cwd: dir, encoding: 'utf8' }), 30_000, burst)).stdout;
      assert.deepEqual(burstCodes.trim().split('\n'), ['200', '200', '200', '200', '200', '200']);
      const retries = demo.output().match(/^retried: speech answered 429 on credential 1, sent again on credential 2 /gm) ?? [];
      assert.ok(retries.length >= 1, demo.output());
      assert.doesNotMatch(demo.output(), /^retried: .*on credential 2,/m);
      for (const used of [0.3, 0.5]) {
        assert.equal((JSON.parse((await exec('sh', ['-c', run], { cwd: dir, encoding: 'utf8' })).stdout) as { data: { status: string } }).data.status, 'READY');
        await eventually(async () => (await scraperUsed()) === used, 30_000, `the run booked (used ${used})`);
      }
      assert.equal((JSON.parse((await exec('sh', ['-c', run], { cwd: dir, encoding: 'utf8' })).stdout) as { code: string }).code, 'budget_exceeded');
      demo.child.kill('SIGINT');
      const result = await deadline(demo.done, 10_000, 'demo exit');
      assert.equal(result.code, 0);
      assert.match(result.stderr, /"msg":"request completed"/);
      const retriedLines = result.stderr.split('\n').filter((l) => l.includes('"refusedBy":"1:429"'));
      assert.equal(retriedLines.length, retries.length);
      for (const l of retriedLines) assert.match(l, /"route":"speech".*"status":200.*"credential":2,/);
      // Two of the six at least waited for room (four slots, six streams), and their lines say how long.
      const waited = result.stderr.split('\n').filter((l) => l.includes('/stream"') && /"queuedMs":\d/.test(l));
      assert.ok(waited.length >= 2, `${waited.length} streams waited`);
    } finally {
      demo.child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
