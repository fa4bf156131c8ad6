// Lint runs before the type check in `npm test`; tsc covers typing, this
// covers habits. The rules that need types (typescript-eslint's
// type-checked set) run on everything TypeScript: a promise nobody handles
// (`void p.then(...)` without a rejection path, an async callback where a
// plain one is expected) fails here, not in production.
import js from '@eslint/js';
import tseslint from 'typescript-eslint';

// node:test's test() and describe() return promises the runner awaits.
const NODE_TEST = { from: 'package', package: 'node:test', name: ['test', 'describe', 'it', 'suite', 'before', 'after', 'beforeEach', 'afterEach'] };

export default tseslint.config(
  { ignores: ['node_modules/', 'coverage/', 'dist/', 'bench/results/', 'test-artifacts/'] },
  js.configs.recommended,
  ...tseslint.configs.recommended,
  {
    languageOptions: {
      globals: {
        process: 'readonly',
        Buffer: 'readonly',
        console: 'readonly',
        setTimeout: 'readonly',
        clearTimeout: 'readonly',
        setInterval: 'readonly',
        clearInterval: 'readonly',
        setImmediate: 'readonly',
        URL: 'readonly',
        performance: 'readonly',
      },
    },
    rules: {
      'no-console': 'error',
      '@typescript-eslint/consistent-type-imports': 'error',
      '@typescript-eslint/no-unused-vars': ['error', { argsIgnorePattern: '^_' }],
      eqeqeq: ['error', 'always'],
    },
  },
  // Type-aware rules on every TypeScript file (tsconfig.json's project).
  {
    files: ['**/*.ts'],
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      '@typescript-eslint/no-floating-promises': ['error', { allowForKnownSafeCalls: [NODE_TEST] }],
      '@typescript-eslint/no-misused-promises': 'error',
      '@typescript-eslint/await-thenable': 'error',
      '@typescript-eslint/no-unnecessary-type-assertion': 'error',
      '@typescript-eslint/only-throw-error': 'error',
      '@typescript-eslint/unbound-method': 'error',
    },
  },
  // The gateway itself: the whole type-checked set, and functions a reader can hold in their head.
  {
    files: ['src/**/*.ts'],
    extends: [tseslint.configs.recommendedTypeCheckedOnly],
    rules: {
      // In the gateway even a `void`ed promise needs its rejection handled: an unhandled one ends the process.
      '@typescript-eslint/no-floating-promises': ['error', { ignoreVoid: false }],
      'max-lines-per-function': ['error', { max: 80 }],
    },
  },
  // The CLI, scripts, benchmarks and tests talk to a terminal on purpose.
  { files: ['src/cli.ts', 'src/dev/demo.ts', 'scripts/**', 'bench/**', 'test/**'], rules: { 'no-console': 'off' } },
);
