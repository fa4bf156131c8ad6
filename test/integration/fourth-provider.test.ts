// A provider is one entry of the table (routes.ts, docs/routes.md): add a
// fourth one here, and the configuration, the stand-ins, the demo, the
// gateway and its metrics take it up with no other change.
import assert from 'node:assert/strict';
import { EventEmitter } from 'node:events';
import { Writable } from 'node:stream';
import { test } from 'node:test';
import { runDemo } from '../../src/dev/demo.ts';
import { UPSTREAMS, type UpstreamSpec } from '../../src/request/routes.ts';
import { startStandins } from '../../src/dev/standins.ts';
import { request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { sampleSecrets, startGateway } from '../support/gateway.ts';
import { parseProm } from '../support/prom.ts';
import { startUpstream } from '../support/upstream.ts';

const weather: UpstreamSpec = {
  name: 'weather',
  urlEnv: 'KEYWARD_WEATHER_URL',
  defaultUrl: 'https://api.weather.invalid',
  methods: ['GET'],
  secretEnvs: ['KEYWARD_WEATHER_KEY'],
  credential: ([key]) => ['x-weather-key', key ?? ''],
  secretForms: ([key]) => [{ form: 'key', value: key ?? '' }],
  dropQuery: ['appid'],
  overrideQuery: [],
  stripHeaders: [],
  native: { kind: 'header', name: 'x-weather-key' },
  cost: null,
  sampleSecrets: (tag) => [`wk_${tag}`],
  demo: { title: 'weather: today (JSON)', examples: [{ method: 'GET', path: '/v1/today', status: 200 }] },
};
const providers = [...UPSTREAMS, weather];

test('a fourth provider added to the table is routed, credentialed, filtered and counted like the others', async () => {
  const secrets = sampleSecrets(providers);
  const standins = await startStandins(secrets, providers);
  const echo = await startUpstream((req, res) => {
    // Echoes the credential it was given, as a careless upstream might.
    const body = JSON.stringify({ key: req.headers['x-weather-key'] ?? null });
    res.writeHead(200, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) });
    res.end(body);
  });
  const gw = await startGateway({ providers, secrets, upstreams: standins.urls, env: { KEYWARD_ADMIN_PORT: 'off' } });
  const gw2 = await startGateway({ providers, secrets, upstreams: { weather: echo.url } });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    // The stand-in answers only with the injected credential: 200 proves the gateway set it.
    const today = await request(`${gw.url}/weather/v1/today?appid=${gw.token}`, { headers: auth });
    assert.equal(today.status, 200);
    assert.deepEqual(today.json(), { ok: true, provider: 'weather', method: 'GET', path: '/v1/today' });
    assert.equal((await request(`${gw.url}/weather/v1/today`, { method: 'POST', headers: auth })).status, 404, 'its method list holds');
    assert.equal((await request(`${gw.url}/weather/v1/today`)).status, 401);
    // The shipped ones still work beside it.
    assert.equal((await request(`${gw.url}/seo/v3/appendix/user_data`, { headers: auth })).status, 200);
    // Counted under its own route label (completion runs as each response closes).
    const weatherCount = async (code: string): Promise<number> =>
      parseProm(await gw.gateway.metrics.text()).sum('keyward_requests_total', { route: 'weather', code });
    await eventually(async () => (await weatherCount('200')) === 1, 2_000, 'weather requests counted');
    // Its secret is kept out of responses too, and its credential parameter never reaches it.
    const echoed = await request(`${gw2.url}/weather/v1/today?appid=x&city=Oslo`, { headers: { authorization: `Bearer ${gw2.token}` } });
    assert.deepEqual(echoed.json(), { key: '*'.repeat((secrets.weather?.[0] ?? '').length) });
    assert.equal(echo.requests[0]?.url, '/v1/today?city=Oslo');
    assert.equal(echo.requests[0]?.headers['x-weather-key'], secrets.weather?.[0]);
  } finally {
    await gw.close();
    await gw2.close();
    await echo.close();
    await standins.close();
  }
});

test('the demo shows a fourth provider with a command that works as printed', async () => {
  let out = '';
  const stdout = new Writable({
    write(chunk: Buffer, _e, cb) {
      out += chunk.toString();
      cb();
    },
  });
  const signals = new EventEmitter();
  const stderr = new Writable({ write: (_c, _e, cb) => cb() });
  const done = runDemo({ env: { KEYWARD_PORT: '0', KEYWARD_LOG_LEVEL: 'silent' }, cwd: process.cwd(), pid: process.pid, stdout, stderr, signals }, providers);
  try {
    await eventually(() => out.includes('Ctrl-C stops the demo.'), 10_000, 'demo printed');
    assert.match(out, /^# weather: today \(JSON\)$/m);
    const line = out.split('\n').find((l) => l.includes('/weather/v1/today')) as string;
    const url = /(http:\/\/\S+\/weather\/v1\/today)/.exec(line)?.[1] as string;
    const token = /Bearer (kw_\w+)/.exec(line)?.[1] as string;
    const r = await request(url, { headers: { authorization: `Bearer ${token}` } });
    assert.equal(r.status, 200);
    assert.equal((r.json() as { provider: string }).provider, 'weather');
  } finally {
    signals.emit('SIGINT');
    assert.equal(await done, 0);
  }
});
