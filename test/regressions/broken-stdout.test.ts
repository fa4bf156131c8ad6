// A log reader that goes away (the journal restarting, `keyward serve | head`)
// must neither crash the gateway nor hang its exit: sonic-boom's synchronous
// flush loops forever on EPIPE, so the last flush on SIGTERM is asynchronous.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { request } from '../support/client.ts';
import { deadline } from '../support/deadline.ts';
import { BIN, childEnv } from '../support/cli.ts';

test('serve whose stdout reader has gone keeps serving and exits cleanly on SIGTERM', async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-epipe-'));
  let stop = (): void => undefined;
  try {
    const child = spawn(BIN, ['serve'], {
      env: childEnv({ KEYWARD_PORT: '0', KEYWARD_KEYS_FILE: join(dir, 'keys.json') }),
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    stop = () => child.kill('SIGKILL');
    const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
    const first = await deadline(
      new Promise<string>((resolve) => {
        let seen = '';
        child.stdout?.on('data', (d: Buffer) => {
          seen += d.toString();
          if (seen.includes('\n')) resolve(seen);
        });
      }),
      15_000,
      'first log line',
    );
    const port = (JSON.parse(first.split('\n')[0] as string) as { port: number }).port;
    child.stdout?.destroy(); // the reader leaves: every later write is EPIPE
    for (let i = 0; i < 3; i++) assert.equal((await request(`http://127.0.0.1:${port}/seo/v3/x`)).status, 401);
    child.kill('SIGTERM');
    assert.equal(await deadline(exited, 8_000, 'exit after SIGTERM'), 0);
  } finally {
    stop(); // a no-op once it exited; a hung gateway must not outlive the test
    rmSync(dir, { recursive: true, force: true });
  }
});
