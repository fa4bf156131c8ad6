// Which options a reload cannot apply, named as users write them.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { restartOnlyChanges } from '../../src/process/runtime.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';

const read = (): string => {
  throw Object.assign(new Error('no file'), { code: 'ENOENT' });
};
const config = (env: Record<string, string>) => loadConfig(env, read, '/srv', UPSTREAMS);

test('a reload names every restart-only option that changed by its KEYWARD_ name, the database URL included', () => {
  const before = config({});
  assert.deepEqual(restartOnlyChanges(before, config({})), []);
  assert.deepEqual(restartOnlyChanges(before, config({ KEYWARD_PORT: '9000' })), ['KEYWARD_PORT']);
  assert.deepEqual(restartOnlyChanges(before, config({ KEYWARD_DATABASE_URL: 'postgres://db/keyward' })), ['KEYWARD_DATABASE_URL']);
  assert.deepEqual(
    restartOnlyChanges(
      before,
      config({ KEYWARD_HOST: '::1', KEYWARD_WORKERS: '2', KEYWARD_KEYS_FILE: '/x/keys.json', KEYWARD_MAX_HEADER_SIZE: '32KiB', KEYWARD_ADMIN_PORT: 'off' }),
    ),
    ['KEYWARD_HOST', 'KEYWARD_WORKERS', 'KEYWARD_KEYS_FILE', 'KEYWARD_MAX_HEADER_SIZE', 'KEYWARD_ADMIN_HOST', 'KEYWARD_ADMIN_PORT'],
  );
  // What a reload does apply is not listed.
  assert.deepEqual(restartOnlyChanges(before, config({ KEYWARD_IDLE_TIMEOUT: '1m', KEYWARD_LOG_LEVEL: 'warn', KEYWARD_SPEECH_KEY: 'k' })), []);
});
