// CPU time and memory of a whole process tree, from /proc (Linux).
import { existsSync, readdirSync, readFileSync } from 'node:fs';

const TICK_US = 1_000_000 / 100; // CLK_TCK is 100 on Linux
const SCHEDSTAT = existsSync('/proc/self/schedstat');

function stat(pid: number): { ppid: number; cpuUs: number } | null {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
    // fields[0] is state (field 3); utime and stime are fields 14 and 15.
    return { ppid: Number(fields[1]), cpuUs: (Number(fields[11]) + Number(fields[12])) * TICK_US };
  } catch {
    return null;
  }
}

/** The pid and all its descendants alive now. */
export function tree(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid)) continue;
    const s = stat(pid);
    if (s === null) continue;
    const list = children.get(s.ppid) ?? [];
    list.push(pid);
    children.set(s.ppid, list);
  }
  const out: number[] = [];
  const walk = (pid: number): void => {
    out.push(pid);
    for (const c of children.get(pid) ?? []) walk(c);
  };
  walk(root);
  return out;
}

/**
 * CPU time of the tree, microseconds, from each thread's `schedstat` (time on
 * a CPU, nanoseconds): /proc/PID/stat counts in 10 ms clock ticks, too
 * coarse for a handful of 50 MiB uploads (it showed as 100000 / 90000 /
 * 50000 µs steps). Falls back to the ticks where schedstat is missing.
 */
export function cpuUs(pids: readonly number[]): number {
  let total = 0;
  for (const pid of pids) {
    if (!SCHEDSTAT) {
      total += stat(pid)?.cpuUs ?? 0;
      continue;
    }
    let threads: string[] = [];
    try {
      threads = readdirSync(`/proc/${pid}/task`);
    } catch {
      // gone
    }
    for (const tid of threads) {
      try {
        total += Number(readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').split(' ')[0]) / 1000;
      } catch {
        // the thread ended meanwhile
      }
    }
  }
  return total;
}

/** Resident memory of the tree, bytes. */
export function rssBytes(pids: readonly number[]): number {
  let total = 0;
  for (const pid of pids) {
    try {
      const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
      if (m) total += Number(m[1]) * 1024;
    } catch {
      // gone
    }
  }
  return total;
}

/** Sample the tree's RSS every `everyMs` until stopped; returns the peak. */
export function rssPeak(pids: readonly number[], everyMs = 50): () => number {
  let peak = rssBytes(pids);
  const timer = setInterval(() => (peak = Math.max(peak, rssBytes(pids))), everyMs);
  return () => {
    clearInterval(timer);
    return Math.max(peak, rssBytes(pids));
  };
}

export function machine(): string {
  try {
    const cpu = /model name\s*:\s*(.+)/.exec(readFileSync('/proc/cpuinfo', 'utf8'))?.[1] ?? 'unknown CPU';
    const cores = readFileSync('/proc/cpuinfo', 'utf8').match(/^processor\s*:/gm)?.length ?? 0;
    const mem = /MemTotal:\s+(\d+) kB/.exec(readFileSync('/proc/meminfo', 'utf8'))?.[1];
    return `${cores} × ${cpu}, ${Math.round(Number(mem) / 1024 / 1024)} GiB, Linux, Node ${process.version}`;
  } catch {
    return `Node ${process.version}`;
  }
}
