// `npm install` / `npm ci` in a checkout: compile src/ into dist/ when the
// compiler is there. A production install (`--omit=dev`) has no TypeScript;
// bin/keyward then runs the sources with Node's type stripping, so the
// install still gives a runnable gateway.
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';

const require = createRequire(import.meta.url);
try {
  require.resolve('typescript');
} catch {
  console.log('keyward: no TypeScript compiler (production install): bin/keyward will run the sources directly.');
  process.exit(0);
}
execFileSync('npm', ['run', 'build'], { stdio: 'inherit' });
