// scripts/reap.mjs: what a test run started, at any depth and in a session of
// its own, is ended when the run ends, also when it is interrupted.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { collect } from '../support/cli.ts';
import { deadline, eventually } from '../support/deadline.ts';

const REAP = fileURLToPath(new URL('../../scripts/reap.mjs', import.meta.url));
const alive = (pid: number): boolean => existsSync(`/proc/${pid}`) && !/^State:\s+Z/m.test(safeStatus(pid));
function safeStatus(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/status`, 'utf8');
  } catch {
    return '';
  }
}

/** Start the reaper over a shell line that leaves a process in a session of its own; its pid, from the first line printed. */
async function leaveBehind(line: string): Promise<{ run: ReturnType<typeof spawn>; done: ReturnType<typeof collect>; orphan: number }> {
  const run = spawn(process.execPath, [REAP, '--', 'bash', '-c', line], { stdio: ['ignore', 'pipe', 'pipe'] });
  const done = collect(run);
  let out = '';
  run.stdout?.on('data', (d: Buffer) => (out += d.toString()));
  await eventually(() => /^\d+\n/.test(out), 10_000, 'the orphan started');
  return { run, done, orphan: Number(out.split('\n')[0]) };
}

test(
  'a process left in a session of its own is ended when the run ends, and the exit code is the command’s',
  { skip: process.platform !== 'linux' },
  async () => {
    const { done, orphan } = await leaveBehind('setsid sleep 120 & echo $!; exit 3');
    const r = await deadline(done, 60_000, 'reaper exit');
    assert.equal(r.code, 3);
    assert.match(r.stderr, /reap: ending 1 process/);
    await eventually(() => !alive(orphan), 5_000, 'the orphan ended');
  },
);

test('interrupted (SIGINT): the command and what it started are ended', { skip: process.platform !== 'linux' }, async () => {
  const { run, done, orphan } = await leaveBehind('setsid sleep 120 & echo $!; sleep 120');
  run.kill('SIGINT');
  const r = await deadline(done, 60_000, 'reaper exit');
  assert.notEqual(r.code, 0);
  await eventually(() => !alive(orphan), 5_000, 'the orphan ended');
});
