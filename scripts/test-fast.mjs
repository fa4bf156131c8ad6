#!/usr/bin/env node
// `npm run test:fast`: the fast tier of test/tiers.json (test/README.md),
// without coverage, for the minute between two edits. `npm test` runs every
// file, with coverage; CI runs that.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';

const tiers = JSON.parse(readFileSync(new URL('../test/tiers.json', import.meta.url), 'utf8'));
const child = spawn(process.execPath, ['--import', 'tsx', '--test', '--test-timeout=60000', '--test-concurrency=4', ...process.argv.slice(2), ...tiers.fast], {
  stdio: 'inherit',
});
child.on('exit', (code) => process.exit(code ?? 1));
