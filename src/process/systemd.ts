// systemd socket activation (sd_listen_fds(3)): systemd holds the listening
// socket and passes it as fd 3 with LISTEN_FDS=1 and LISTEN_PID=<our pid>,
// so a restart refuses no connection: they queue in the kernel meanwhile.
// LISTEN_PID guards against a child inheriting variables meant for its parent.
import type { Env } from '../config/load.ts';

const SD_LISTEN_FDS_START = 3;

/** The inherited listening fd, or null when the process was not socket-activated. */
export function inheritedListenFd(env: Env, pid: number): number | null {
  // Set by the cluster primary for its workers, which share its inherited socket.
  if (env.KEYWARD_INHERITED_FD !== undefined && /^\d+$/.test(env.KEYWARD_INHERITED_FD)) return Number(env.KEYWARD_INHERITED_FD);
  if (env.LISTEN_PID === undefined || Number(env.LISTEN_PID) !== pid) return null;
  const count = Number(env.LISTEN_FDS ?? '0');
  return Number.isInteger(count) && count >= 1 ? SD_LISTEN_FDS_START : null;
}
