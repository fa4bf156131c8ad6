// systemd (docs/operations.md): the units pass `systemd-analyze verify`, and the
// gateway runs the way systemd starts it under socket activation: a listening
// socket as fd 3, LISTEN_FDS=1 and LISTEN_PID naming the process.
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import net, { type AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { request } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { BIN, childEnv, collect, runCli } from '../support/cli.ts';
import { startUpstream } from '../support/upstream.ts';

const CONTRIB = fileURLToPath(new URL('../../contrib/', import.meta.url));

test('contrib/keyward.service and keyward.socket pass systemd-analyze verify', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-units-'));
  try {
    const service = readFileSync(join(CONTRIB, 'keyward.service'), 'utf8');
    // verify checks that ExecStart exists: point it at this checkout's entry point.
    assert.match(service, /^ExecStart=\/opt\/keyward\/node_modules\/\.bin\/keyward serve$/m);
    writeFileSync(join(dir, 'keyward.service'), service.replace(/^ExecStart=\S+/m, `ExecStart=${BIN}`));
    writeFileSync(join(dir, 'keyward.socket'), readFileSync(join(CONTRIB, 'keyward.socket'), 'utf8'));
    const { stdout, stderr } = await promisify(execFile)('systemd-analyze', ['verify', join(dir, 'keyward.service'), join(dir, 'keyward.socket')]);
    assert.equal(`${stdout}${stderr}`.trim(), '', 'no warnings');
    // What Node needs: no W^X memory (V8 JIT); the stop timeout outlasts the default 30 s drain.
    assert.doesNotMatch(service, /^MemoryDenyWriteExecute=yes/m);
    assert.ok(Number(/^TimeoutStopSec=(\d+)$/m.exec(service)?.[1]) > 30);
    assert.match(service, /^ExecReload=\/bin\/kill -HUP \$MAINPID$/m);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

async function listeningFd(): Promise<{ server: net.Server; port: number; fd: number }> {
  const server = net.createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const fd = (server as unknown as { _handle: { fd: number } })._handle.fd;
  return { server, port: (server.address() as AddressInfo).port, fd };
}

for (const workers of ['1', '2']) {
  test(`socket activation: the gateway serves on the inherited fd 3 (KEYWARD_WORKERS=${workers})`, async () => {
    const dir = mkdtempSync(join(tmpdir(), 'keyward-sd-'));
    const up = await startUpstream();
    const sock = await listeningFd();
    try {
      const env = {
        KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
        KEYWARD_SEO_URL: up.url,
        KEYWARD_SEO_LOGIN: 'l',
        KEYWARD_SEO_PASSWORD: 'p',
        KEYWARD_WORKERS: workers,
      };
      const key = JSON.parse((await runCli(['keys', 'create', '--name', 'sd', '--json'], env)).stdout) as { token: string };
      // As systemd does: fd 3 is the socket, and LISTEN_PID is the pid that execs the gateway.
      const child = spawn('/bin/sh', ['-c', `LISTEN_PID=$$ LISTEN_FDS=1 LISTEN_FDNAMES=keyward.socket exec "${BIN}" serve`], {
        env: childEnv({ ...env, KEYWARD_PORT: '1' /* never bound: the inherited socket is used */ }),
        stdio: ['ignore', 'pipe', 'pipe', sock.fd],
      });
      const done = collect(child);
      let out = '';
      child.stdout?.on('data', (d: Buffer) => (out += d.toString()));
      try {
        sock.server.close(); // the parent's copy; the child holds its own
        const expected = workers === '1' ? 2 : 3; // one per worker listening
        await eventually(() => out.split('"msg":"keyward listening"').length === expected, 30_000, 'listening');
        const line = JSON.parse(out.split('\n').find((l) => l.includes('keyward listening')) as string) as { port: number; socketActivated: boolean };
        assert.equal(line.port, sock.port);
        assert.equal(line.socketActivated, true);
        const r = await request(`http://127.0.0.1:${sock.port}/seo/v3/x`, { headers: { authorization: `Bearer ${key.token}` } });
        assert.equal(r.status, 200);
      } finally {
        child.kill('SIGTERM');
        const result = await deadline(done, 10_000, 'exit');
        assert.equal(result.code, 0, result.stderr);
      }
    } finally {
      await up.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
}

test('LISTEN_FDS meant for another process is ignored: the gateway binds its own address', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-sd2-'));
  try {
    const child = spawn(BIN, ['serve'], {
      env: childEnv({ KEYWARD_PORT: '0', KEYWARD_KEYS_FILE: join(dir, 'keys.json'), LISTEN_PID: '1', LISTEN_FDS: '1' }),
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const done = collect(child);
    let out = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await eventually(() => out.includes('keyward listening'), 30_000, 'listening');
    assert.match(out, /"socketActivated":false/);
    child.kill('SIGTERM');
    assert.equal((await deadline(done, 10_000, 'exit')).code, 0);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
