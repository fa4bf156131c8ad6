// What a user configuring keyward for real runs into in the second hour:
// a misspelled variable is named with the one it most likely meant, and
// KEYWARD_STRICT_ENV=1 makes it a configuration error (docs/configuration.md).
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { runCli, startCli } from '../support/cli.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { usageRow } from '../support/rows.ts';

test('a misspelled KEYWARD_* variable is warned about with the closest known name; KEYWARD_STRICT_ENV=1 refuses to start', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-second-'));
  try {
    const env = {
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      KEYWARD_PORT: '0',
      KEYWARD_SCRAPER_KEY: 'apify_api_x',
      KEYWARD_LISTEN_PORT: '41006',
      KEYWARD_DRAIN_TIMOUT: '3s',
    };
    const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
    try {
      await eventually(() => gw.output().split('"msg":"unknown variable').length === 4, 5_000, 'three warnings');
      const warnings = gw
        .output()
        .split('\n')
        .filter((l) => l.includes('"msg":"unknown variable'))
        .map((l) => JSON.parse(l) as { level: number; msg: string });
      assert.deepEqual(
        warnings.map((w) => w.msg),
        [
          'unknown variable KEYWARD_DRAIN_TIMOUT; did you mean KEYWARD_DRAIN_TIMEOUT?',
          'unknown variable KEYWARD_LISTEN_PORT; did you mean KEYWARD_PORT?',
          'unknown variable KEYWARD_SCRAPER_KEY; did you mean KEYWARD_SCRAPER_TOKEN?',
        ],
      );
      assert.ok(warnings.every((w) => w.level === 40));
    } finally {
      gw.child.kill('SIGTERM');
      await deadline(gw.done, 10_000, 'exit');
    }
    // Said in plain words on stderr too, before the gateway listens (written before listen() is called).
    const plain = (await gw.done).stderr.split('\n').filter((l) => l.includes('is not a keyward setting'));
    assert.deepEqual(plain, [
      'keyward: KEYWARD_DRAIN_TIMOUT is not a keyward setting and is ignored; did you mean KEYWARD_DRAIN_TIMEOUT?',
      'keyward: KEYWARD_LISTEN_PORT is not a keyward setting and is ignored; did you mean KEYWARD_PORT?',
      'keyward: KEYWARD_SCRAPER_KEY is not a keyward setting and is ignored; did you mean KEYWARD_SCRAPER_TOKEN?',
    ]);
    const strict = await runCli(['serve'], { ...env, KEYWARD_STRICT_ENV: '1' });
    assert.equal(strict.code, 2);
    assert.match(strict.stderr, /unknown variable KEYWARD_SCRAPER_KEY; did you mean KEYWARD_SCRAPER_TOKEN\?/);
    // Known names, the config file's and the launcher's own, are not reported.
    const clean = await startCli(
      ['serve'],
      {
        KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
        KEYWARD_PORT: '0',
        KEYWARD_ADMIN_PORT: 'off',
        KEYWARD_ADMIN_HOST: '127.0.0.1',
        KEYWARD_STRICT_ENV: '1',
        // The launcher's: which Node runs keyward (docs/install.md).
        KEYWARD_NODE: process.execPath,
      },
      '"msg":"keyward listening"',
    );
    clean.child.kill('SIGTERM');
    const done = await deadline(clean.done, 10_000, 'exit');
    assert.equal(done.code, 0);
    assert.doesNotMatch(done.stdout, /unknown variable/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('start-up errors say what and where in one line: a port in use, a damaged keys file, a missing secret file, serve --port, every bad limit flag', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-second-'));
  const { createServer } = await import('node:net');
  const { writeFileSync } = await import('node:fs');
  const taken = createServer();
  await new Promise<void>((r) => taken.listen(0, '127.0.0.1', r));
  const port = (taken.address() as { port: number }).port;
  try {
    const busy = await runCli(['serve'], { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_PORT: String(port) });
    assert.equal(busy.code, 1);
    assert.equal(
      busy.stderr,
      `keyward: cannot start: KEYWARD_PORT: 127.0.0.1:${port} is already in use (EADDRINUSE: another keyward?); set KEYWARD_PORT to a free port\n`,
      'one line on stderr',
    );
    const fatal = busy.stdout.split('\n').filter((l) => l.includes('"level":60'));
    assert.equal(fatal.length, 1);
    assert.doesNotMatch(fatal[0] as string, /stack|listen\.ts/, 'no stack for a failure the message explains');

    const damaged = join(dir, 'damaged.json');
    writeFileSync(damaged, '{"version":1,"keys":[\n{"id": }\n]}');
    const corrupt = await runCli(['serve'], { KEYWARD_KEYS_FILE: damaged, KEYWARD_PORT: '0' });
    assert.equal(corrupt.code, 1);
    assert.equal(corrupt.stderr, `keyward: cannot start: keys file ${damaged}: not valid JSON at line 2, column 8\n`);

    const missing = join(dir, 'no-such-secret');
    const secret = await runCli(['serve'], { KEYWARD_KEYS_FILE: join(dir, 'keys.json'), KEYWARD_PORT: '0', KEYWARD_SPEECH_KEY_FILE: missing });
    assert.equal(secret.code, 2);
    assert.match(secret.stderr, new RegExp(`KEYWARD_SPEECH_KEY_FILE: cannot read ${missing.replace(/[/.]/g, '\\$&')} \\(ENOENT\\)`));

    const flag = await runCli(['serve', '--port', '41001'], {});
    assert.equal(flag.code, 2);
    assert.match(
      flag.stderr,
      /serve takes no options; it is configured by environment variables \(--port: KEYWARD_PORT, e\.g\. KEYWARD_PORT=… keyward serve\)/,
    );

    const limits = await runCli(['keys', 'create', '--name', 'x', '--rate', '10', '--quota', '5000', '--concurrency', 'many'], {
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    });
    assert.equal(limits.code, 2);
    const first = limits.stderr.split('\n')[0] as string;
    for (const f of ['--rate', '--quota', '--concurrency']) assert.match(first, new RegExp(`${f} must be`), `${f} reported too`);
  } finally {
    taken.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test('keyward usage --until, --by month and the TOTAL rows (cost added up per unit)', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-second-'));
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const { id } = JSON.parse((await runCli(['keys', 'create', '--name', 'finance', '--json'], env)).stdout) as { id: string };
    const { SqliteUsageStore, usagePath } = await import('../../src/ledger/sqlite-store.ts');
    const store = new SqliteUsageStore(usagePath(env.KEYWARD_KEYS_FILE));
    const row = (route: string, day: string, requests: number, cost: number) => usageRow({ keyId: id, route, day, requests, bytesOut: 10 * requests, cost });
    await store.add(
      [row('seo', '2026-10-30', 2, 0.5), row('seo', '2026-10-31', 3, 0.25), row('seo', '2026-11-01', 4, 1), row('speech', '2026-11-02', 5, 300)],
      { gateway: 'seed', seq: 1 },
    );
    await store.close();

    const days = await runCli(['usage', '--since', '2026-10-01', '--until', '2026-10-31', '--csv'], env);
    assert.equal(days.code, 0, days.stderr);
    assert.deepEqual(days.stdout.trim().split('\n').slice(1), [
      '2026-10-30,finance,seo,2,2,0,0,0,0,0,0,20,0.5,usd,0',
      '2026-10-31,finance,seo,3,3,0,0,0,0,0,0,30,0.25,usd,0',
      'TOTAL,,,5,5,0,0,0,0,0,0,50,0.75,usd,',
    ]);

    const months = await runCli(['usage', '--since', '2026-10-01', '--until', '2026-11-30', '--by', 'month', '--csv'], env);
    assert.deepEqual(months.stdout.trim().split('\n').slice(1), [
      '2026-10,finance,seo,5,5,0,0,0,0,0,0,50,0.75,usd,0',
      '2026-11,finance,seo,4,4,0,0,0,0,0,0,40,1,usd,0',
      '2026-11,finance,speech,5,5,0,0,0,0,0,0,50,300,characters,0',
      'TOTAL,,,14,14,0,0,0,0,0,0,140,1.75,usd,',
      'TOTAL,,,,,,,,,,,,300,characters,',
    ]);
    const table = await runCli(['usage', '--since', '2026-10-01', '--until', '2026-11-30', '--by', 'month'], env);
    assert.match(table.stdout, /^TOTAL\s+14\s+14\s+0\s+0\s+0\s+0\s+0\s+0\s+140\s+1\.75\s+usd$/m);
    // By month the first column is the month, in the table and the CSV.
    assert.match(table.stdout, /^MONTH\s+KEY\s+ROUTE\s/);
    assert.match(months.stdout, /^month,key,route,/);
    assert.match((await runCli(['usage', '--since', '2026-10-01', '--until', '2026-11-30'], env)).stdout, /^DAY\s+KEY\s/);
    // An empty range says the range it was asked for, --until included.
    assert.equal((await runCli(['usage', '--since', '2026-09-01', '--until', '2026-09-30'], env)).stdout, 'No usage recorded from 2026-09-01 to 2026-09-30.\n');
    assert.equal((await runCli(['usage', '--since', '2026-12-01'], env)).stdout, 'No usage recorded since 2026-12-01.\n');
    const bad = await runCli(['usage', '--since', '2026-11-01', '--until', '2026-10-01'], env);
    assert.equal(bad.code, 2);
    assert.match(bad.stderr, /--until 2026-10-01 is before --since 2026-11-01/);
    assert.match((await runCli(['usage', '--until', '2026-02-31'], env)).stderr, /--until: 2026-02-31 is not a day of the calendar/);
    assert.match((await runCli(['usage', '--by', 'week'], env)).stderr, /--by must be day, month or credential/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('names a terminal would act on are printed escaped: keys list, usage, revoke', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-second-'));
  try {
    const env = { KEYWARD_KEYS_FILE: join(dir, 'keys.json') };
    const { id } = JSON.parse((await runCli(['keys', 'create', '--name', 'plain', '--json'], env)).stdout) as { id: string };
    // A name set behind keyward's back (as SQL can): a title change, a colour, a forged row, a bidi override.
    const evil = 'evil\x1b]0;pwned\x07\x1b[31mRED\x1b[0m\r\nFAKE-ROW\u202e';
    const { serialiseKeysFile, parseKeysFile } = await import('../../src/keys/file-store.ts');
    const records = parseKeysFile(readFileSync(env.KEYWARD_KEYS_FILE, 'utf8'), ['seo', 'speech']);
    writeFileSync(env.KEYWARD_KEYS_FILE, serialiseKeysFile(records.map((r) => ({ ...r, name: evil }))));
    const { SqliteUsageStore, usagePath } = await import('../../src/ledger/sqlite-store.ts');
    const store = new SqliteUsageStore(usagePath(env.KEYWARD_KEYS_FILE));
    await store.add(
      [{ keyId: id, route: 'seo', day: '2026-10-30', requests: 1, s2xx: 1, s3xx: 0, s4xx: 0, s5xx: 0, other: 0, limited: 0, bytesIn: 0, bytesOut: 1, cost: 0 }],
      { gateway: 'seed', seq: 1 },
    );
    await store.close();
    const shown = 'evil\\x1b]0;pwned\\x07\\x1b[31mRED\\x1b[0m\\x0d\\x0aFAKE-ROW\\u202e';
    for (const args of [
      ['keys', 'list'],
      ['usage', '--since', '2026-10-01'],
      ['usage', '--since', '2026-10-01', '--csv'],
      ['keys', 'revoke', id],
    ]) {
      const r = await runCli(args, env);
      assert.equal(r.code, 0, `${args.join(' ')}: ${r.stderr}`);
      // Not one control character reaches the terminal; the name shows as its escapes.
      assert.equal([...r.stdout].filter((c) => (c < ' ' && c !== '\n') || (c >= '\u007f' && c <= '\u009f') || c === '\u202e').length, 0, args.join(' '));
      assert.ok(r.stdout.includes(shown), `${args.join(' ')}: ${JSON.stringify(r.stdout)}`);
      assert.equal(r.stdout.split('\n').filter((l) => l.startsWith('FAKE-ROW')).length, 0);
    }
    // JSON keeps the name as it is, escaped by JSON itself.
    const json = await runCli(['keys', 'list', '--json'], env);
    assert.equal((JSON.parse(json.stdout) as Array<{ name: string }>)[0]?.name, evil);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
