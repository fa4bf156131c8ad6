// Secrets and PEM files (docs/configuration.md, "Secrets"): from the
// environment, a `_FILE`, or systemd's credentials folder, checked as the
// consumers will use them, so a bad one fails the start (or reload), never
// the first request. Reads files only through the injected reader.
import { join } from 'node:path';
import { createSecureContext } from 'node:tls';
import type { Options, ReadFile } from './options.ts';
import { asError } from '../lib/error.ts';

/**
 * A secret from NAME, NAME_FILE, or systemd's LoadCredential=
 * ($CREDENTIALS_DIRECTORY/<name in lower case>), in that order. One trailing
 * newline is dropped (files written by `echo`).
 */
export function secret(o: Options, name: string, readFile: ReadFile): string | null {
  const direct = o.get(name);
  const file = o.get(`${name}_FILE`);
  if (direct !== undefined && file !== undefined) {
    o.problem(`${name} and ${name}_FILE are both set; set only one`);
    return null;
  }
  let value: string | null = null;
  const credentials = o.get('CREDENTIALS_DIRECTORY');
  if (direct !== undefined) value = direct;
  else if (file !== undefined) {
    try {
      value = readFile(file);
    } catch (err) {
      // A file that was named but cannot be read is a mistake, not "no secret".
      o.problem(`${name}_FILE: cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
      return null;
    }
  } else if (credentials !== undefined) {
    try {
      value = readFile(join(credentials, name.toLowerCase()));
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ENOENT')
        o.problem(`${name}: cannot read the systemd credential (${(err as NodeJS.ErrnoException).code ?? 'error'})`);
      return null;
    }
  }
  if (value === null) return null;
  value = value.replace(/\r?\n$/, '');
  if (value === '') return null;
  // A secret lands in a header; a control character would make every request fail.
  // eslint-disable-next-line no-control-regex
  if (/[\x00-\x1f\x7f]/.test(value)) {
    o.problem(`${name} contains a control character or line break`);
    return null;
  }
  return value;
}

/** Checks PEM material the way the TLS stack will use it. */
function checkTls(o: Options, options: { ca?: string; cert?: string; key?: string }, what: string): boolean {
  try {
    createSecureContext(options);
    return true;
  } catch (err) {
    o.problem(`${what}: ${asError(err).message.split('\n')[0]}`);
    return false;
  }
}

/** KEYWARD_UPSTREAM_CA_FILE: extra CAs for upstream TLS, or null. */
export function upstreamCa(o: Options, readFile: ReadFile): string | null {
  const ca = o.file('KEYWARD_UPSTREAM_CA_FILE', readFile);
  if (ca === null) return null;
  if (!ca.includes('-----BEGIN CERTIFICATE-----')) {
    o.problem('KEYWARD_UPSTREAM_CA_FILE must hold PEM certificates (-----BEGIN CERTIFICATE-----)');
    return ca;
  }
  checkTls(o, { ca }, 'KEYWARD_UPSTREAM_CA_FILE');
  return ca;
}

/** KEYWARD_TLS_CERT_FILE and KEYWARD_TLS_KEY_FILE, both or neither; null serves plain HTTP. */
export function serverTls(o: Options, readFile: ReadFile): { readonly cert: string; readonly key: string } | null {
  const cert = o.file('KEYWARD_TLS_CERT_FILE', readFile);
  const key = o.file('KEYWARD_TLS_KEY_FILE', readFile);
  if ((o.get('KEYWARD_TLS_CERT_FILE') === undefined) !== (o.get('KEYWARD_TLS_KEY_FILE') === undefined)) {
    o.problem('KEYWARD_TLS_CERT_FILE and KEYWARD_TLS_KEY_FILE must be set together');
    return null;
  }
  if (cert === null || key === null) return null;
  return checkTls(o, { cert, key }, 'KEYWARD_TLS_CERT_FILE/KEYWARD_TLS_KEY_FILE') ? { cert, key } : null;
}
