// TLS both ways (docs/security.md): upstream verification always on, a private CA
// added with KEYWARD_UPSTREAM_CA_FILE, sessions resumed; HTTPS on the public
// port with certificates re-read on SIGHUP. Certificates are made here.
import assert from 'node:assert/strict';
import { X509Certificate } from 'node:crypto';
import { copyFileSync, mkdtempSync, rmSync } from 'node:fs';
import https from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import type tls from 'node:tls';
import { deadline, eventually } from '../support/deadline.ts';
import { runCli, startCli } from '../support/cli.ts';
import { startGateway } from '../support/gateway.ts';
import { makePki } from '../support/tls.ts';
import { freePort } from '../../src/process/listen.ts';

interface TlsUpstream {
  readonly url: string;
  readonly resumed: boolean[];
  readonly seen: Array<{ url: string; headers: Record<string, unknown> }>;
  close(): Promise<void>;
}

/** An HTTPS upstream that closes every connection after one answer, so each request needs a new handshake. */
async function startTlsUpstream(cert: string, key: string): Promise<TlsUpstream> {
  const resumed: boolean[] = [];
  const seen: TlsUpstream['seen'] = [];
  const server = https.createServer({ cert, key }, (req, res) => {
    seen.push({ url: req.url as string, headers: req.headers });
    req.resume();
    req.on('end', () => res.writeHead(200, { connection: 'close', 'content-type': 'application/json' }).end('{"ok":true}'));
  });
  server.on('secureConnection', (socket: tls.TLSSocket) => resumed.push(socket.isSessionReused()));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
    resumed,
    seen,
    close: () =>
      new Promise((r) => {
        server.closeAllConnections();
        server.close(() => r());
      }),
  };
}

function get(url: string, token: string, ca?: string): Promise<{ status: number; body: string; cert: tls.PeerCertificate | null }> {
  return deadline(
    new Promise((resolve, reject) => {
      const req = https.get(url, { agent: false, ca, headers: { authorization: `Bearer ${token}` } }, (res) => {
        let body = '';
        const cert = (res.socket as tls.TLSSocket).getPeerCertificate?.() ?? null;
        res.setEncoding('utf8').on('data', (d: string) => (body += d));
        res.on('end', () => resolve({ status: res.statusCode as number, body, cert }));
      });
      req.on('error', reject);
    }),
    10_000,
    `GET ${url}`,
  );
}

test('an upstream with a private CA: refused (502, reason logged) until KEYWARD_UPSTREAM_CA_FILE trusts it; then sessions resume', async () => {
  const pki = makePki();
  const leaf = pki.leaf('upstream', ['IP:127.0.0.1']);
  const up = await startTlsUpstream(leaf.cert, leaf.key);
  const untrusting = await startGateway({ seo: up.url });
  const trusting = await startGateway({ seo: up.url, env: { KEYWARD_UPSTREAM_CA_FILE: pki.caFile } });
  try {
    const refused = await fetch(`${untrusting.url}/seo/v3/x`, { headers: { authorization: `Bearer ${untrusting.token}` } });
    assert.equal(refused.status, 502);
    assert.equal(((await refused.json()) as { code: string }).code, 'upstream_unreachable');
    await eventually(() => untrusting.logs().some((l) => l.msg === 'request completed'), 2_000, 'log line');
    const line = untrusting.logs().find((l) => l.msg === 'request completed');
    assert.equal(line?.error, 'UNABLE_TO_VERIFY_LEAF_SIGNATURE', 'the log names why verification failed');
    assert.equal(line?.level, 40);
    assert.equal(up.seen.length, 0);

    for (let i = 0; i < 3; i++) {
      const ok = await fetch(`${trusting.url}/seo/v3/x?i=${i}`, { headers: { authorization: `Bearer ${trusting.token}` } });
      assert.equal(ok.status, 200);
      await ok.text();
    }
    assert.equal(up.seen.length, 3);
    const basic = `Basic ${Buffer.from(`${trusting.secrets.seoLogin}:${trusting.secrets.seoPassword}`).toString('base64')}`;
    for (const s of up.seen) assert.equal(s.headers.authorization, basic);
    assert.deepEqual(up.resumed, [false, true, true], 'the second and third connections resumed the first TLS session');
  } finally {
    await untrusting.close();
    await trusting.close();
    await up.close();
    pki.cleanup();
  }
});

test('an upstream certificate for another name is refused with 502 and the reason logged', async () => {
  const pki = makePki();
  const leaf = pki.leaf('elsewhere', ['DNS:elsewhere.example']);
  const up = await startTlsUpstream(leaf.cert, leaf.key);
  const gw = await startGateway({ seo: up.url, env: { KEYWARD_UPSTREAM_CA_FILE: pki.caFile } });
  try {
    const r = await fetch(`${gw.url}/seo/v3/x`, { headers: { authorization: `Bearer ${gw.token}` } });
    assert.equal(r.status, 502);
    await eventually(() => gw.logs().some((l) => l.msg === 'request completed'), 2_000, 'log line');
    assert.equal(gw.logs().find((l) => l.msg === 'request completed')?.error, 'ERR_TLS_CERT_ALTNAME_INVALID');
  } finally {
    await gw.close();
    await up.close();
    pki.cleanup();
  }
});

test('a CA file that is not PEM, or a certificate without its key, is a configuration error naming the option', async () => {
  const pki = makePki();
  try {
    const leaf = pki.leaf('gw', ['IP:127.0.0.1']);
    const r = await runCli(['serve'], { KEYWARD_PORT: '0', KEYWARD_UPSTREAM_CA_FILE: leaf.keyFile, KEYWARD_TLS_CERT_FILE: leaf.certFile });
    assert.equal(r.code, 2);
    assert.match(r.stderr, /KEYWARD_UPSTREAM_CA_FILE must hold PEM certificates/);
    assert.match(r.stderr, /KEYWARD_TLS_CERT_FILE and KEYWARD_TLS_KEY_FILE must be set together/);
    const other = pki.leaf('other', ['IP:127.0.0.1']);
    const mismatch = await runCli(['serve'], { KEYWARD_PORT: '0', KEYWARD_TLS_CERT_FILE: leaf.certFile, KEYWARD_TLS_KEY_FILE: other.keyFile });
    assert.equal(mismatch.code, 2);
    assert.match(mismatch.stderr, /KEYWARD_TLS_CERT_FILE\/KEYWARD_TLS_KEY_FILE: .*key values mismatch/);
  } finally {
    pki.cleanup();
  }
});

test('HTTPS on the public port; SIGHUP re-reads the certificate without dropping a connection', async () => {
  const pki = makePki();
  const dir = mkdtempSync(join(tmpdir(), 'keyward-tls-'));
  const first = pki.leaf('first', ['IP:127.0.0.1']);
  const second = pki.leaf('second', ['IP:127.0.0.1']);
  const certFile = join(dir, 'cert.pem');
  const keyFile = join(dir, 'key.pem');
  copyFileSync(first.certFile, certFile);
  copyFileSync(first.keyFile, keyFile);
  const env = {
    KEYWARD_PORT: '0',
    KEYWARD_KEYS_FILE: join(dir, 'keys.json'),
    KEYWARD_TLS_CERT_FILE: certFile,
    KEYWARD_TLS_KEY_FILE: keyFile,
    KEYWARD_SEO_URL: `http://127.0.0.1:${await freePort()}`,
    KEYWARD_SEO_LOGIN: 'l',
    KEYWARD_SEO_PASSWORD: 'p',
  };
  const key = JSON.parse((await runCli(['keys', 'create', '--name', 'tls', '--json'], env)).stdout) as { token: string };
  const serve = await startCli(['serve'], env, '"msg":"keyward listening"');
  try {
    const port = (
      JSON.parse(
        serve
          .output()
          .split('\n')
          .find((l) => l.includes('keyward listening')) as string,
      ) as { port: number; tls: boolean }
    ).port;
    const url = `https://127.0.0.1:${port}/nowhere/x`;
    const before = await get(url, key.token, pki.ca);
    assert.equal(before.status, 404, 'served over TLS, authenticated, routed');
    const fingerprint = (pem: string): string => new X509Certificate(pem).fingerprint256;
    assert.equal(before.cert?.fingerprint256, fingerprint(first.cert));
    // A connection open across the reload keeps working.
    const agent = new https.Agent({ keepAlive: true, ca: pki.ca });
    const kept = await new Promise<tls.TLSSocket>((resolve, reject) => {
      const r = https.get(url, { agent, headers: { authorization: `Bearer ${key.token}` } }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.socket as tls.TLSSocket));
      });
      r.on('error', reject);
    });
    copyFileSync(second.certFile, certFile);
    copyFileSync(second.keyFile, keyFile);
    serve.child.kill('SIGHUP');
    await eventually(() => serve.output().includes('"msg":"configuration reloaded"'), 5_000, 'reloaded');
    const after = await get(url, key.token, pki.ca);
    assert.equal(after.cert?.fingerprint256, fingerprint(second.cert), 'new connections get the new certificate');
    const reused = await new Promise<boolean>((resolve, reject) => {
      const r = https.get(url, { agent, headers: { authorization: `Bearer ${key.token}` } }, (res) => {
        res.resume();
        res.on('end', () => resolve(res.socket === kept));
      });
      r.on('error', reject);
    });
    assert.equal(reused, true, 'the connection opened before the reload still serves');
    agent.destroy();
  } finally {
    serve.child.kill('SIGTERM');
    await deadline(serve.done, 10_000, 'exit');
    rmSync(dir, { recursive: true, force: true });
    pki.cleanup();
  }
});
