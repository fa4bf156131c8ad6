// `keyward demo`: stand-in upstreams, the gateway in front of them, a demo
// key, and curl commands that work as printed. No upstream account needed.
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Io } from './cli/args.ts';
import { loadConfig } from './config.ts';
import { FileKeyStore } from './keys/file-store.ts';
import { createKey } from './keys/manage.ts';
import { createLogger } from './log.ts';
import { createGateway } from './server.ts';
import { startStandins } from './standins.ts';

export async function runDemo(io: Io): Promise<number> {
  const secrets = {
    scraperToken: `apify_api_demo${randomBytes(12).toString('hex')}`,
    seoLogin: 'demo@example.com',
    seoPassword: randomBytes(12).toString('hex'),
    speechKey: `sk_demo${randomBytes(12).toString('hex')}`,
  };
  const standins = await startStandins(secrets);
  const dir = mkdtempSync(join(tmpdir(), 'keyward-demo-'));
  const env = {
    KEYWARD_HOST: io.env.KEYWARD_HOST,
    KEYWARD_PORT: io.env.KEYWARD_PORT,
    KEYWARD_LOG_LEVEL: io.env.KEYWARD_LOG_LEVEL,
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_SCRAPER_URL: standins.urls.scraper,
    KEYWARD_SCRAPER_TOKEN: secrets.scraperToken,
    KEYWARD_SEO_URL: standins.urls.seo,
    KEYWARD_SEO_LOGIN: secrets.seoLogin,
    KEYWARD_SEO_PASSWORD: secrets.seoPassword,
    KEYWARD_SPEECH_URL: standins.urls.speech,
    KEYWARD_SPEECH_KEY: secrets.speechKey,
  };
  const config = loadConfig(env, (p) => readFileSync(p, 'utf8'), io.cwd);
  const store = new FileKeyStore(config.keysFile);
  const { token } = await createKey(store, 'demo');
  // Request logs go to stderr so the instructions on stdout stay readable.
  const log = createLogger(config.logLevel, undefined, 2);
  const gateway = await createGateway(config, store, log.logger);
  const address = await gateway.listen();
  const base = `http://${address.address.includes(':') ? `[${address.address}]` : address.address}:${address.port}`;
  const auth = `-H 'Authorization: Bearer ${token}'`;
  const text = [
    '',
    `keyward demo: gateway on ${base}, stand-in upstreams on 127.0.0.1, demo key "demo".`,
    `Token: ${token}`,
    '',
    '# scraper: start an actor run (JSON with data.status "READY")',
    `curl -sS -X POST ${auth} -H 'content-type: application/json' -d '{"startUrls":[{"url":"https://example.com"}]}' ${base}/scraper/v2/acts/apify~web-scraper/runs`,
    '',
    '# seo: account data (JSON with status_code 20000)',
    `curl -sS ${auth} ${base}/seo/v3/appendix/user_data`,
    '',
    '# speech: synthesise to a file (32 KiB of audio/mpeg), then a slow stream (64 KiB over 2 s)',
    `curl -sS -X POST ${auth} -H 'content-type: application/json' -d '{"text":"Hello from keyward"}' -o hello.mp3 ${base}/speech/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM`,
    `curl -sSN -X POST ${auth} -H 'content-type: application/json' -d '{"text":"Hello"}' -o stream.mp3 ${base}/speech/v1/text-to-speech/21m00Tcm4TlvDq8ikWAM/stream`,
    '',
    '# no token: refused by the gateway (401 {"error":"Unauthorized.","code":"unauthorized"})',
    `curl -sS ${base}/seo/v3/appendix/user_data`,
    '',
    'Request logs follow on stderr. Ctrl-C stops the demo.',
    '',
  ].join('\n');
  io.stdout.write(`${text}\n`);

  return new Promise((resolve) => {
    const stop = (): void => {
      void gateway
        .shutdown()
        .then(() => standins.close())
        .then(() => log.flush())
        .then(() => {
          rmSync(dir, { recursive: true, force: true });
          resolve(0);
        });
    };
    io.signals.once('SIGINT', stop);
    io.signals.once('SIGTERM', stop);
  });
}
