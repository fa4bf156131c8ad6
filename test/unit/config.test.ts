import assert from 'node:assert/strict';
import { test } from 'node:test';
import { ConfigError, effectiveEnv, keysFilePath, loadConfig, parseEnvFile } from '../../src/config/load.ts';
import { ERRORS, UPSTREAM_ANSWERS, upstreamReason } from '../../src/request/errors.ts';
import { parseDuration, parseSize } from '../../src/lib/units.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';

const noFiles = (p: string): string => {
  throw Object.assign(new Error(`ENOENT ${p}`), { code: 'ENOENT' });
};

test('defaults: loopback:8080, ./keys.json, info, all routes present but disabled without secrets', () => {
  const c = loadConfig({}, noFiles, '/srv/app', UPSTREAMS);
  assert.equal(c.host, '127.0.0.1');
  assert.equal(c.port, 8080);
  assert.equal(c.keysFile, '/srv/app/keys.json');
  assert.equal(c.logLevel, 'info');
  assert.equal(c.upstreamTimeoutMs, 300_000);
  assert.equal(c.drainTimeoutMs, 30_000);
  assert.equal(c.maxBodyBytes, 2 * 1024 ** 3);
  assert.deepEqual(
    c.routes.map((r) => [r.name, r.target.href, r.credential]),
    [
      ['scraper', 'https://api.apify.com/', null],
      ['seo', 'https://api.dataforseo.com/', null],
      ['speech', 'https://api.elevenlabs.io/', null],
    ],
  );
  assert.deepEqual(c.enabledRoutes, []);
  assert.ok(Object.isFrozen(c) && Object.isFrozen(c.routes) && Object.isFrozen(c.routes[0]));
});

test('credentials are built per route; a base URL path becomes the upstream prefix', () => {
  const c = loadConfig(
    {
      KEYWARD_SCRAPER_TOKEN: 'st',
      KEYWARD_SEO_LOGIN: 'me',
      KEYWARD_SEO_PASSWORD: 'pw',
      KEYWARD_SPEECH_KEY: 'sk',
      KEYWARD_SEO_URL: 'http://127.0.0.1:9000/base/',
    },
    noFiles,
    '/',
    UPSTREAMS,
  );
  const [scraper, seo, speech] = c.routes;
  assert.deepEqual(scraper?.credential, ['authorization', 'Bearer st']);
  assert.deepEqual(seo?.credential, ['authorization', `Basic ${Buffer.from('me:pw').toString('base64')}`]);
  assert.deepEqual(speech?.credential, ['xi-api-key', 'sk']);
  assert.equal(seo?.target.href, 'http://127.0.0.1:9000/');
  assert.equal(seo?.basePath, '/base');
  assert.deepEqual(c.enabledRoutes, ['scraper', 'seo', 'speech']);
});

test('secrets come from NAME, NAME_FILE or the systemd credentials directory', () => {
  const files: Record<string, string> = { '/run/secret/speech': 'from-file\n', '/creds/keyward_scraper_token': 'from-creds\n' };
  const read = (p: string): string => {
    if (p in files) return files[p] as string;
    throw Object.assign(new Error('nope'), { code: 'ENOENT' });
  };
  const c = loadConfig({ KEYWARD_SPEECH_KEY_FILE: '/run/secret/speech', CREDENTIALS_DIRECTORY: '/creds' }, read, '/', UPSTREAMS);
  assert.deepEqual(c.routes[2]?.credential, ['xi-api-key', 'from-file']);
  assert.deepEqual(c.routes[0]?.credential, ['authorization', 'Bearer from-creds']);
  assert.equal(c.routes[1]?.credential, null);
});

test('every problem is reported at once, each with its option name, and no secret value', () => {
  let err: unknown;
  try {
    loadConfig(
      {
        KEYWARD_PORT: '99999',
        KEYWARD_LOG_LEVEL: 'loud',
        KEYWARD_UPSTREAM_TIMEOUT: '30',
        KEYWARD_MAX_BODY: 'big',
        KEYWARD_SCRAPER_URL: 'ftp://x',
        KEYWARD_SEO_URL: 'not a url',
        KEYWARD_SPEECH_URL: 'https://user:pw@host/',
        KEYWARD_SEO_LOGIN: 'only-login',
        KEYWARD_SCRAPER_TOKEN: 'VALUE1',
        KEYWARD_SCRAPER_TOKEN_FILE: '/x',
        KEYWARD_SPEECH_KEY: 'bad\nVALUE2',
        KEYWARD_DRAIN_TIMEOUT: '0s',
      },
      noFiles,
      '/',
      UPSTREAMS,
    );
  } catch (e) {
    err = e;
  }
  assert.ok(err instanceof ConfigError);
  const text = err.problems.join('\n');
  for (const name of [
    'KEYWARD_PORT',
    'KEYWARD_LOG_LEVEL',
    'KEYWARD_UPSTREAM_TIMEOUT',
    'KEYWARD_MAX_BODY',
    'KEYWARD_SCRAPER_URL',
    'KEYWARD_SEO_URL',
    'KEYWARD_SPEECH_URL',
    'KEYWARD_SEO_PASSWORD',
    'KEYWARD_SCRAPER_TOKEN_FILE',
    'KEYWARD_SPEECH_KEY',
    'KEYWARD_DRAIN_TIMEOUT',
  ]) {
    assert.match(text, new RegExp(name), name);
  }
  assert.doesNotMatch(text, /VALUE1|VALUE2|only-login/);
  assert.equal(err.problems.length, 11);
});

test('an unreadable secret file is a problem; a missing systemd credential is not', () => {
  assert.throws(
    () => loadConfig({ KEYWARD_SPEECH_KEY_FILE: '/missing' }, noFiles, '/', UPSTREAMS),
    /KEYWARD_SPEECH_KEY_FILE: cannot read \/missing \(ENOENT\)/,
  );
  const eacces = (): string => {
    throw Object.assign(new Error('denied'), { code: 'EACCES' });
  };
  assert.throws(() => loadConfig({ CREDENTIALS_DIRECTORY: '/c' }, eacces, '/', UPSTREAMS), /systemd credential \(EACCES\)/);
  assert.equal(loadConfig({ CREDENTIALS_DIRECTORY: '/c' }, noFiles, '/', UPSTREAMS).enabledRoutes.length, 0);
  assert.equal(loadConfig({ KEYWARD_SPEECH_KEY: '\n' }, noFiles, '/', UPSTREAMS).enabledRoutes.length, 0);
});

test('keys file location follows KEYWARD_KEYS_FILE, then STATE_DIRECTORY', () => {
  assert.equal(keysFilePath({ KEYWARD_KEYS_FILE: 'k.json' }, '/w'), '/w/k.json');
  assert.equal(keysFilePath({ STATE_DIRECTORY: '/var/lib/keyward:/other' }, '/w'), '/var/lib/keyward/keys.json');
  assert.equal(keysFilePath({}, '/w'), '/w/keys.json');
});

test('units: durations and sizes need a unit', () => {
  assert.equal(parseDuration('1500ms'), 1500);
  assert.equal(parseDuration('30s'), 30_000);
  assert.equal(parseDuration('5m'), 300_000);
  assert.equal(parseDuration('2h'), 7_200_000);
  assert.equal(parseDuration('30d'), 2_592_000_000);
  assert.equal(parseDuration('0.5s'), 500);
  assert.equal(parseDuration('30'), null);
  assert.equal(parseDuration('-1s'), null);
  assert.equal(parseSize('1KiB'), 1024);
  assert.equal(parseSize('2GiB'), 2 * 1024 ** 3);
  assert.equal(parseSize('10MB'), 10_000_000);
  assert.equal(parseSize('512'), null);
});

test('upstream failures map to 502 or 504 by cause, never by guess', () => {
  const answer = (code: string | undefined): unknown => UPSTREAM_ANSWERS[upstreamReason(code)];
  assert.equal(answer('ECONNREFUSED'), ERRORS.upstreamUnreachable);
  assert.equal(answer('ECONNRESET'), ERRORS.upstreamUnreachable);
  assert.equal(answer('ERR_TLS_CERT_ALTNAME_INVALID'), ERRORS.upstreamUnreachable);
  assert.equal(answer(undefined), ERRORS.upstreamUnreachable);
  assert.equal(answer('ECONNECT_TIMEOUT'), ERRORS.upstreamTimeout);
  assert.equal(answer('KEYWARD_UPSTREAM_TIMEOUT'), ERRORS.upstreamTimeout);
  assert.equal(ERRORS.unauthorized.body.toString(), '{"error":"Unauthorized.","code":"unauthorized"}');
});

test('options added for hardening and operations: defaults with units, every problem reported with its name', () => {
  const c = loadConfig({}, noFiles, '/srv/app', UPSTREAMS);
  assert.equal(c.idleTimeoutMs, 300_000);
  assert.equal(c.maxHeaderBytes, 16 * 1024);
  assert.equal(c.maxConnections, 10_000);
  assert.equal(c.upstreamCa, null);
  assert.equal(c.tls, null);
  assert.deepEqual(c.admin, { host: '127.0.0.1', port: 9097 });
  // The usage page behind a token on loopback too (docs/admin-api.md, "Safety"); anything but auto or on is named.
  assert.deepEqual(loadConfig({ KEYWARD_ADMIN_REQUIRE_TOKEN: 'on' }, noFiles, '/srv', UPSTREAMS).admin, { host: '127.0.0.1', port: 9097, tokenForUsage: true });
  assert.throws(() => loadConfig({ KEYWARD_ADMIN_REQUIRE_TOKEN: 'yes' }, noFiles, '/srv', UPSTREAMS), /KEYWARD_ADMIN_REQUIRE_TOKEN must be auto or on/);
  assert.ok(c.routes.every((r) => r.native === null));
  const set = loadConfig(
    {
      KEYWARD_IDLE_TIMEOUT: '90s',
      KEYWARD_MAX_HEADER_SIZE: '32KiB',
      KEYWARD_MAX_CONNECTIONS: '500',
      KEYWARD_ADMIN_PORT: 'off',
      KEYWARD_NATIVE_AUTH: 'speech, seo',
    },
    noFiles,
    '/',
    UPSTREAMS,
  );
  assert.equal(set.idleTimeoutMs, 90_000);
  assert.equal(set.maxHeaderBytes, 32 * 1024);
  assert.equal(set.maxConnections, 500);
  assert.equal(set.admin, null);
  assert.deepEqual(
    set.routes.filter((r) => r.native !== null).map((r) => [r.name, r.native?.kind]),
    [
      ['seo', 'basic'],
      ['speech', 'header'],
    ],
  );
  try {
    loadConfig(
      {
        KEYWARD_IDLE_TIMEOUT: '5',
        KEYWARD_MAX_HEADER_SIZE: '10B',
        KEYWARD_MAX_CONNECTIONS: 'many',
        KEYWARD_ADMIN_PORT: '70000',
        KEYWARD_NATIVE_AUTH: 'video',
        KEYWARD_UPSTREAM_CA_FILE: '/nope',
        KEYWARD_TLS_KEY_FILE: '/k',
      },
      noFiles,
      '/',
      UPSTREAMS,
    );
    assert.fail('should have thrown');
  } catch (err) {
    assert.ok(err instanceof ConfigError);
    const text = err.problems.join('\n');
    for (const name of [
      'KEYWARD_IDLE_TIMEOUT',
      'KEYWARD_MAX_HEADER_SIZE',
      'KEYWARD_MAX_CONNECTIONS',
      'KEYWARD_ADMIN_PORT',
      'KEYWARD_NATIVE_AUTH',
      'KEYWARD_UPSTREAM_CA_FILE',
      'KEYWARD_TLS_CERT_FILE',
    ]) {
      assert.match(text, new RegExp(name), name);
    }
  }
});

test('KEYWARD_CONFIG_FILE: NAME=value lines over the environment; a bad line is a problem with its number', () => {
  const files: Record<string, string> = { '/etc/kw.env': '# comment\n\nexport KEYWARD_PORT=9000\nKEYWARD_LOG_LEVEL="warn"\n' };
  const read = (p: string): string => files[p] ?? noFiles(p);
  const env = effectiveEnv({ KEYWARD_CONFIG_FILE: '/etc/kw.env', KEYWARD_PORT: '8000', KEYWARD_HOST: '0.0.0.0' }, read);
  assert.equal(env.KEYWARD_PORT, '9000');
  assert.equal(env.KEYWARD_LOG_LEVEL, 'warn');
  assert.equal(env.KEYWARD_HOST, '0.0.0.0');
  assert.deepEqual(parseEnvFile('A=1\nnonsense\n').problems, ['KEYWARD_CONFIG_FILE line 2: expected NAME=value']);
  assert.throws(() => effectiveEnv({ KEYWARD_CONFIG_FILE: '/missing' }, read), /KEYWARD_CONFIG_FILE: cannot read \/missing \(ENOENT\)/);
});

test('an alert webhook URL with a login in it is refused at start, without echoing the password', () => {
  const load = (url: string): ConfigError | null => {
    try {
      loadConfig({ KEYWARD_ALERT_WEBHOOK: url }, noFiles, '/', UPSTREAMS);
      return null;
    } catch (err) {
      return err as ConfigError;
    }
  };
  for (const url of ['http://user:s3cretpw@hooks.example.com/alert', 'https://user@hooks.example.com/alert']) {
    const err = load(url);
    assert.ok(err instanceof ConfigError, url);
    assert.match(err.problems.join('\n'), /KEYWARD_ALERT_WEBHOOK must not carry a login/);
    assert.doesNotMatch(err.problems.join('\n'), /s3cretpw/);
  }
  assert.equal(load('https://hooks.example.com/alert?token=abc'), null);
});

test('an upstream URL set to nothing, or without its scheme, is a problem that says so', () => {
  const problems = (env: Record<string, string>): string[] => {
    try {
      loadConfig(env, noFiles, '/', UPSTREAMS);
    } catch (e) {
      if (e instanceof ConfigError) return [...e.problems];
      throw e;
    }
    return [];
  };
  assert.deepEqual(problems({ KEYWARD_SPEECH_URL: '' }), ['KEYWARD_SPEECH_URL is set but empty; unset it to use https://api.elevenlabs.io']);
  assert.deepEqual(problems({ KEYWARD_SPEECH_URL: 'api.elevenlabs.io' }), [
    'KEYWARD_SPEECH_URL is not a URL (the scheme is missing: https://api.elevenlabs.io)',
  ]);
  assert.deepEqual(problems({ KEYWARD_SEO_URL: 'not a url' }), ['KEYWARD_SEO_URL is not a URL']);
});

test('KEYWARD_ADMISSION_WAIT is bounded at 10 s, since a worker waits for its primary longer than it (docs/configuration.md)', () => {
  assert.equal(loadConfig({ KEYWARD_ADMISSION_WAIT: '10s' }, noFiles, '/', UPSTREAMS).admissionWaitMs, 10_000);
  assert.throws(
    () => loadConfig({ KEYWARD_ADMISSION_WAIT: '11s' }, noFiles, '/', UPSTREAMS),
    (e: unknown) => e instanceof ConfigError && e.problems.some((p) => p.startsWith('KEYWARD_ADMISSION_WAIT must be a duration up to 10s')),
  );
});
