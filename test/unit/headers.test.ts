import assert from 'node:assert/strict';
import { test } from 'node:test';
import { loadConfig } from '../../src/config/load.ts';
import { downstreamResponseHeaders, upstreamRequestHeaders } from '../../src/request/headers.ts';
import { generateToken } from '../../src/keys/token.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';

const config = loadConfig({ KEYWARD_SPEECH_KEY: 'SPEECHKEY', KEYWARD_SCRAPER_TOKEN: 'SCRAPERKEY' }, () => '', '/', UPSTREAMS);
const speech = config.routes.find((r) => r.name === 'speech')!;
const scraper = config.routes.find((r) => r.name === 'scraper')!;
const TOKEN = generateToken();
const OTHER = generateToken();

test('request headers: client credentials out, upstream credential in, hop-by-hop gone', () => {
  const out = upstreamRequestHeaders(
    {
      host: 'gateway',
      authorization: `Bearer ${TOKEN}`,
      'xi-api-key': 'client-guess',
      'proxy-authorization': 'Basic abc',
      connection: 'keep-alive, X-Hop, close',
      'x-hop': '1',
      'keep-alive': 'timeout=5',
      'proxy-connection': 'keep-alive',
      te: 'trailers',
      trailer: 'x-t',
      upgrade: 'h2c',
      expect: '100-continue',
      'x-http-method-override': 'DELETE',
      'x-api-key': TOKEN,
      cookie: `a=1; session=${TOKEN}`,
      // the forms a literal comparison misses: lower-cased, percent-encoded,
      // as a header name, and another key of the same client
      'x-lower': TOKEN.toLowerCase(),
      'x-encoded': `t=%6B%77%5F${TOKEN.slice(3)}`,
      [`x-${TOKEN.toLowerCase()}`]: '1',
      'x-other-key': OTHER,
      accept: 'audio/mpeg',
      'content-type': 'application/json',
    },
    speech,
    speech.credential!,
  );
  assert.deepEqual(out, { accept: 'audio/mpeg', 'content-type': 'application/json', 'xi-api-key': 'SPEECHKEY' });
});

test('request framing survives a Connection header that names it', () => {
  const cl = upstreamRequestHeaders({ connection: 'content-length', 'content-length': '5' }, scraper, scraper.credential!);
  assert.equal(cl['content-length'], '5');
  const te = upstreamRequestHeaders({ connection: 'transfer-encoding', 'transfer-encoding': 'chunked' }, scraper, scraper.credential!);
  assert.equal(te['transfer-encoding'], 'chunked');
  assert.equal(te['content-length'], undefined);
  assert.equal(scraper.credential![0], 'authorization');
  assert.equal(te.authorization, 'Bearer SCRAPERKEY');
});

test('response headers: hop-by-hop and Connection-named removed, case and repeats kept', () => {
  const raw = [
    'Content-Type',
    'audio/mpeg',
    'Set-Cookie',
    'a=1',
    'Connection',
    'keep-alive, X-Private',
    'X-Private',
    'secret-ish',
    'Keep-Alive',
    'timeout=77',
    'Transfer-Encoding',
    'chunked',
    'Proxy-Connection',
    'keep-alive',
    'Trailer',
    'x-t',
    'Upgrade',
    'h2c',
    'TE',
    'trailers',
    'set-cookie',
    'b=2',
    'X-Request-Id',
    'abc',
  ];
  assert.deepEqual(downstreamResponseHeaders(raw), ['Content-Type', 'audio/mpeg', 'Set-Cookie', 'a=1', 'set-cookie', 'b=2', 'X-Request-Id', 'abc']);
});
