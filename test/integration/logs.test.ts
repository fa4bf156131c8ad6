// docs/logs.md: exactly one JSON line per request, with the agreed fields and nothing secret.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { raw, request } from '../support/client.ts';
import { eventually } from '../support/deadline.ts';
import { createKey, revokeKey } from '../../src/keys/manage.ts';
import { generateToken } from '../../src/keys/token.ts';
import { startGateway } from '../support/gateway.ts';
import { startUpstream } from '../support/upstream.ts';

test('one "request completed" line per request with every agreed field', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ scraper: up.url, seo: up.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    const answer = await request(`${gw.url}/scraper/v2/acts/x/runs?token=SHOULD-NOT-BE-LOGGED&tok%65n=NOR-THIS&timeout=60`, {
      method: 'POST',
      headers: auth,
      body: 'abcde',
    });
    await request(`${gw.url}/seo/v3/x?token=kept-on-seo`, { headers: auth });
    await request(`${gw.url}/nowhere?token=unrouted-secret`, { headers: auth });
    await request(`${gw.url}/seo/v3/x`, {});
    const lines = gw.logs().filter((l) => l.msg === 'request completed');
    assert.equal(lines.length, 4);
    const [first, second, third, fourth] = lines;
    for (const key of [
      'time',
      'reqId',
      'client',
      'keyId',
      'keyName',
      'route',
      'method',
      'path',
      'status',
      'bytesIn',
      'bytesOut',
      'durationMs',
      'ttfbMs',
      'queuedMs',
    ]) {
      assert.ok(key in (first ?? {}), key);
    }
    assert.equal(first?.keyId, gw.keyId);
    assert.equal(first?.keyName, 'tester');
    assert.equal(first?.route, 'scraper');
    assert.equal(first?.method, 'POST');
    assert.equal(first?.path, '/scraper/v2/acts/x/runs?timeout=60');
    assert.equal(first?.status, 200);
    assert.equal(first?.bytesIn, 5);
    assert.equal(first?.bytesOut, answer.body.length, 'body bytes, not header bytes');
    assert.equal(first?.client, '127.0.0.1');
    assert.ok((first?.durationMs as number) >= (first?.ttfbMs as number));
    // Nothing waited for room (no route here has a capacity): null, never a number.
    assert.equal(first?.queuedMs, null);
    assert.equal(first?.level, 30);
    assert.equal(second?.path, '/seo/v3/x?token=kept-on-seo');
    assert.equal(third?.path, '/nowhere', 'credential parameters of every route are dropped from unrouted paths');
    assert.equal(third?.status, 404);
    assert.equal(fourth?.status, 401);
    assert.equal(fourth?.keyId, null);
    assert.equal(fourth?.bytesOut, Buffer.byteLength('{"error":"Unauthorized.","code":"unauthorized"}'));
    assert.equal(fourth?.authFailure, 'missing');
    assert.equal(first?.authFailure, null);
    assert.notEqual(first?.reqId, second?.reqId);
    assert.doesNotMatch(gw.logText(), /SHOULD-NOT-BE-LOGGED|NOR-THIS|unrouted-secret/);
  } finally {
    await gw.close();
    await up.close();
  }
});

test('no log line ever carries a secret or a client token, whatever the request', async () => {
  const up = await startUpstream();
  const gw = await startGateway({ scraper: up.url, seo: up.url, speech: up.url });
  try {
    const t = gw.token;
    await raw(gw.port, `GET /speech/v1/x?xi-api-key=${t} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${t}\r\nConnection: close\r\n\r\n`);
    await raw(gw.port, `GET /seo/${t} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${t}x\r\nConnection: close\r\n\r\n`);
    await raw(gw.port, `POST /scraper/v2/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${t}\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n`);
    await raw(gw.port, `GET /seo/x HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer ${t}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n`);
    await request(`${gw.url}/speech/v1/voices`, { headers: { authorization: `Bearer ${t}`, 'xi-api-key': t } });
    const text = gw.logText();
    assert.ok(text.split('\n').length > 5);
    for (const secret of [t, ...Object.values(gw.secrets).filter((v) => !v.startsWith('seologin'))]) assert.equal(text.includes(secret), false);
  } finally {
    await gw.close();
    await up.close();
  }
});

test("a 401's line says why the token was refused, never the token", async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url });
  try {
    const revoked = await createKey(gw.store, 'gone');
    await revokeKey(gw.store, 'gone');
    const expired = await createKey(gw.store, 'old', { expiresInMs: 1 });
    const unknown = generateToken();
    // The gateway reads the keys file within a second (later under load); both keys then name themselves.
    await eventually(
      async () =>
        (await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${revoked.token}` } })).status === 401 &&
        (await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${expired.token}` } })).status === 401 &&
        gw.logs().some((l) => l.keyId === revoked.record.id) &&
        gw.logs().some((l) => l.keyId === expired.record.id),
      15_000,
      'the revoked and the expired key in force',
    );
    const before = gw.logs().filter((l) => l.msg === 'request completed').length;
    const tries: Array<[Record<string, string>, string, string | null]> = [
      [{}, 'missing', null],
      [{ authorization: 'Bearer kw_tooshort' }, 'malformed', null],
      [{ authorization: `Bearer ${unknown}` }, 'unknown', null],
      [{ authorization: `Bearer ${revoked.token}` }, 'revoked', revoked.record.id],
      [{ authorization: `Bearer ${expired.token}` }, 'expired', expired.record.id],
    ];
    for (const [headers] of tries) assert.equal((await request(`${gw.url}/seo/v3/x`, { headers })).status, 401);
    const lines = gw
      .logs()
      .filter((l) => l.msg === 'request completed')
      .slice(before);
    assert.deepEqual(
      lines.map((l) => [l.status, l.authFailure, l.keyId]),
      tries.map(([, why, key]) => [401, why, key]),
    );
    for (const t of [unknown, revoked.token, expired.token]) assert.equal(gw.logText().includes(t), false);
    // A request that was let in carries none.
    assert.equal((await request(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } })).status, 200);
    assert.equal(
      gw
        .logs()
        .filter((l) => l.msg === 'request completed')
        .at(-1)?.authFailure,
      null,
    );
  } finally {
    await gw.close();
    await up.close();
  }
});

test("a client's W3C traceparent goes upstream unchanged and its trace id is in the request's line; a malformed one is forwarded but not logged", async () => {
  const up = await startUpstream();
  const gw = await startGateway({ seo: up.url, speech: up.url });
  try {
    const auth = { authorization: `Bearer ${gw.token}` };
    const traceId = '4bf92f3577b34da6a3ce929d0e0e4736';
    const parent = `00-${traceId}-00f067aa0ba902b7-01`;
    const state = 'congo=t61rcWkgMzE,rojo=00f067aa0ba902b7';
    await request(`${gw.url}/seo/v3/x`, { headers: { ...auth, traceparent: parent, tracestate: state } });
    // A later version's header (longer, more fields) still names its trace id (W3C Trace Context §4.3).
    await request(`${gw.url}/speech/v1/x`, { headers: { ...auth, traceparent: `01-${traceId.replace('4', '5')}-00f067aa0ba902b7-01-extra` } });
    const bad = [
      '00-00000000000000000000000000000000-00f067aa0ba902b7-01', // an all-zero trace id is invalid
      `00-${traceId.toUpperCase()}-00f067aa0ba902b7-01`, // upper-case hex is invalid
      `00-${traceId}-0000000000000000-01`, // an all-zero parent id is invalid
      `ff-${traceId}-00f067aa0ba902b7-01`, // version ff is invalid
      `00-${traceId}-00f067aa0ba902b7-01-extra`, // version 00 has exactly four fields
      `00-${traceId}"},"keyId":"forged-00f067aa0ba902b7-01`,
    ];
    for (const b of bad) await request(`${gw.url}/seo/v3/x`, { headers: { ...auth, traceparent: b } });
    await eventually(() => gw.logs().filter((l) => l.msg === 'request completed').length === 2 + bad.length, 5_000, 'every line');
    const lines = gw.logs().filter((l) => l.msg === 'request completed');
    assert.equal(lines[0]?.traceId, traceId);
    assert.equal(lines[1]?.traceId, traceId.replace('4', '5'));
    for (const l of lines.slice(2)) assert.equal(l.traceId, null, String(l.path));
    assert.equal(lines[2]?.keyId, gw.keyId, 'a forged field in the header changes nothing in the line');
    // What the upstream received: the client's headers as they were.
    assert.equal(up.requests[0]?.headers.traceparent, parent);
    assert.equal(up.requests[0]?.headers.tracestate, state);
    assert.equal(up.requests.at(-1)?.headers.traceparent, bad.at(-1));
  } finally {
    await gw.close();
    await up.close();
  }
});
