// The process boundary: the only place that reads process.env or calls process.exit.
import { run } from './cli.ts';
import { UPSTREAMS } from './request/routes.ts';

const code = await run(
  process.argv.slice(2),
  {
    env: process.env,
    cwd: process.cwd(),
    pid: process.pid,
    stdout: process.stdout,
    stderr: process.stderr,
    signals: process,
  },
  UPSTREAMS,
);
process.exit(code);
