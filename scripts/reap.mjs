#!/usr/bin/env node
// Runs a command and, however it ends (done, failed, interrupted with
// Ctrl-C, or sent SIGTERM), ends every process it started, at any depth:
// gateways, PostgreSQL servers, walkthrough scripts. Some of those put
// themselves in a process group or session of their own (a README block
// run as a script, a database server), so a process group is not enough:
// each process started under this one carries a marker in its environment
// (KEYWARD_REAP=<id>), and what still carries it at the end is sent SIGTERM,
// then SIGKILL after a few seconds. Linux only (/proc); elsewhere the
// command runs as it is.
//
//   node scripts/reap.mjs -- npm run test:coverage
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';

const at = process.argv.indexOf('--');
const command = at < 0 ? process.argv.slice(2) : process.argv.slice(at + 1);
if (command.length === 0) {
  process.stderr.write('usage: node scripts/reap.mjs -- COMMAND [ARGS…]\n');
  process.exit(2);
}
const id = randomBytes(8).toString('hex');
const marker = `KEYWARD_REAP=${id}`;
const child = spawn(command[0], command.slice(1), { stdio: 'inherit', env: { ...process.env, KEYWARD_REAP: id } });

/** Every process whose environment carries this run's marker, but this one. */
function marked() {
  let pids = [];
  try {
    pids = readdirSync('/proc').filter((n) => /^\d+$/.test(n));
  } catch {
    return [];
  }
  return pids
    .map(Number)
    .filter((pid) => pid !== process.pid)
    .filter((pid) => {
      try {
        return readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0').includes(marker);
      } catch {
        return false; // gone, or not ours to read
      }
    });
}

function signal(pids, sig) {
  for (const pid of pids) {
    try {
      process.kill(pid, sig);
    } catch {
      // already gone
    }
  }
}

/** SIGTERM what is left, then SIGKILL whatever did not exit within `graceMs`; says what it ended. */
async function reap(graceMs) {
  let left = marked();
  if (left.length === 0) return;
  process.stderr.write(`reap: ending ${left.length} process(es) the run left behind: ${left.join(' ')}\n`);
  signal(left, 'SIGTERM');
  const until = Date.now() + graceMs;
  while (Date.now() < until && (left = marked()).length > 0) await new Promise((r) => setTimeout(r, 100));
  if (left.length > 0) signal(left, 'SIGKILL');
}

let interrupted = false;
for (const sig of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.on(sig, () => {
    interrupted = true;
    // Passed on; if the command has not ended within 10 s, everything is ended.
    if (child.exitCode === null) child.kill(sig);
    setTimeout(() => void reap(0).then(() => process.exit(130)), 10_000).unref();
  });
}

child.on('exit', (code, sig) => {
  void reap(interrupted ? 2_000 : 5_000).then(() => process.exit(code ?? (sig === null ? 1 : 130)));
});
