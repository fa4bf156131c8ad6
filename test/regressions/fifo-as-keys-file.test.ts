// Hardening, round 2. A FIFO in place of the keys file: opening it to read
// waits for a writer, and the event loop with it (docs/keys.md). It is
// refused and logged, the last good set serves, SIGTERM still stops it.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { raw } from '../support/client.ts';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { startUpstream } from '../support/upstream.ts';

test('a FIFO in place of the keys file is refused and logged; the last good set serves and SIGTERM still stops the gateway', { timeout: 60_000 }, async () => {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-fifo-'));
  const up = await startUpstream();
  try {
    const env = {
      KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
      KEYWARD_PORT: '0',
      KEYWARD_ADMIN_PORT: 'off',
      KEYWARD_SEO_URL: up.url,
      KEYWARD_SEO_LOGIN: 'l',
      KEYWARD_SEO_PASSWORD: 'p',
    };
    const key = JSON.parse((await runCli(['keys', 'create', '--name', 'f', '--json'], env)).stdout) as { token: string };
    const gw = await startCli(['serve'], env, '"msg":"keyward listening"');
    try {
      const port = (
        JSON.parse(
          gw
            .output()
            .split('\n')
            .find((l) => l.includes('"msg":"keyward listening"')) as string,
        ) as { port: number }
      ).port;
      const fifo = join(dir, 'fifo');
      execFileSync('mkfifo', [fifo]);
      renameSync(fifo, env.KEYWARD_KEYS_FILE);
      await eventually(() => gw.output().includes('is not a regular file'), 5_000, 'refusal logged');
      const out = await raw(port, `GET /seo/v3/x HTTP/1.1\r\nhost: x\r\nauthorization: Bearer ${key.token}\r\nconnection: close\r\n\r\n`);
      assert.match(out, /^HTTP\/1\.1 200 /, 'the last good set serves');
      await new Promise((r) => setTimeout(r, 600));
      assert.equal(
        gw
          .output()
          .split('\n')
          .filter((l) => l.includes('is not a regular file')).length,
        1,
        'logged once, not on every poll',
      );
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
