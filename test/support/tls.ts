// Certificates made at test time with the openssl command line: a private CA
// and leaf certificates it signs. Nothing is committed, nothing is shared.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface Pki {
  readonly dir: string;
  readonly caFile: string;
  readonly ca: string;
  /** A key and a certificate signed by the CA for the given names (`DNS:x`, `IP:127.0.0.1`). */
  leaf(name: string, altNames: readonly string[]): { certFile: string; keyFile: string; cert: string; key: string };
  cleanup(): void;
}

function openssl(args: string[], cwd: string): void {
  execFileSync('openssl', args, { cwd, stdio: ['ignore', 'ignore', 'pipe'] });
}

export function makePki(): Pki {
  const dir = mkdtempSync(join(tmpdir(), 'keyward-pki-'));
  openssl(
    [
      'req',
      '-x509',
      '-newkey',
      'ec',
      '-pkeyopt',
      'ec_paramgen_curve:prime256v1',
      '-nodes',
      '-keyout',
      'ca.key',
      '-out',
      'ca.pem',
      '-days',
      '2',
      '-subj',
      '/CN=keyward test CA',
    ],
    dir,
  );
  return {
    dir,
    caFile: join(dir, 'ca.pem'),
    ca: readFileSync(join(dir, 'ca.pem'), 'utf8'),
    leaf(name, altNames) {
      openssl(
        ['req', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=${name}`],
        dir,
      );
      writeFileSync(
        join(dir, `${name}.ext`),
        `subjectAltName=${altNames.join(',')}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n`,
      );
      openssl(
        [
          'x509',
          '-req',
          '-in',
          `${name}.csr`,
          '-CA',
          'ca.pem',
          '-CAkey',
          'ca.key',
          '-CAcreateserial',
          '-out',
          `${name}.pem`,
          '-days',
          '2',
          '-extfile',
          `${name}.ext`,
        ],
        dir,
      );
      const certFile = join(dir, `${name}.pem`);
      const keyFile = join(dir, `${name}.key`);
      return { certFile, keyFile, cert: readFileSync(certFile, 'utf8'), key: readFileSync(keyFile, 'utf8') };
    },
    cleanup: () => rmSync(dir, { recursive: true, force: true }),
  };
}
