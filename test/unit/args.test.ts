// Command-line parsing (docs/cli.md): a mistyped option names the one it most likely meant, as a mistyped command does.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { parse, UsageError } from '../../src/cli/args.ts';

const OPTIONS = { name: { type: 'string' }, routes: { type: 'string' }, 'run-cap': { type: 'string' } } as const;

test('an unknown option suggests the known one it most likely meant; one far from any is named alone', () => {
  const message = (args: string[]): string => {
    try {
      parse(args, OPTIONS, 'help');
    } catch (err) {
      assert.ok(err instanceof UsageError);
      return err.message;
    }
    throw new Error('parsed');
  };
  assert.equal(message(['--nmae', 'x']), "Unknown option '--nmae'; did you mean --name?");
  assert.equal(message(['--run-cpa', '1']), "Unknown option '--run-cpa'; did you mean --run-cap?");
  assert.match(message(['--completely-else']), /^Unknown option '--completely-else'/);
  assert.doesNotMatch(message(['--completely-else']), /did you mean/);
});
