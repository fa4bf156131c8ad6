// The Node flags `bin/keyward` starts the gateway with, read from the script
// itself, so that a profile or a count runs keyward exactly as users do.
import { readFileSync } from 'node:fs';

const script = readFileSync(new URL('../bin/keyward', import.meta.url), 'utf8');
const line = /^flags="([^"]*)"$/m.exec(script);
if (line === null) throw new Error('bin/keyward: no flags="…" line');

// And what it adds on the Node it runs (the Node 24 the project installs): `flags="$flags …"`.
const added = [...script.matchAll(/flags="\$flags ([^"]*)"/g)].map((m) => m[1] ?? '');

export const KEYWARD_NODE_FLAGS: readonly string[] = [line[1] ?? '', ...added].join(' ').split(' ').filter(Boolean);
