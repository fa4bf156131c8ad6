// A 401 on a route with several credentials (docs/credentials.md, "Set
// aside"): the provider says in its body whether the account is refused or
// only the call (a scoped key outside its scope), so the body's first bytes
// are read before the credential is set aside or the answer is relayed. Only
// this answer, only on such a route: every other response streams untouched.
import type http from 'node:http';
import { PassThrough, type Transform } from 'node:stream';
import { UNAUTHORIZED_BODY_MAX, type Unauthorized, type Route } from './routes.ts';
import { decodersFor } from './relay.ts';

/** The first bytes of a 401, as they came, and whether they are the whole body. */
export interface Peeked {
  readonly chunks: readonly Buffer[];
  readonly whole: boolean;
}

/**
 * Reads `proxyRes` until it ends or UNAUTHORIZED_BODY_MAX bytes came, then
 * pauses it (the rest, if any, stays with the upstream's socket). A failure
 * mid-body ends the read with what came; the stand-in (`replay`) passes the
 * failure on to the relay.
 */
export function peek(proxyRes: http.IncomingMessage): Promise<Peeked> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const done = (): void => {
      proxyRes.pause();
      proxyRes.removeListener('data', onData);
      proxyRes.removeListener('end', done);
      proxyRes.removeListener('close', done);
      proxyRes.removeListener('error', done);
      resolve({ chunks, whole: proxyRes.readableEnded || (proxyRes.complete && proxyRes.readableLength === 0) });
    };
    const onData = (chunk: Buffer): void => {
      chunks.push(chunk);
      size += chunk.length;
      if (size >= UNAUTHORIZED_BODY_MAX) done();
    };
    proxyRes.on('data', onData);
    proxyRes.once('end', done);
    proxyRes.once('close', done);
    proxyRes.once('error', done);
  });
}

/** What the route's provider says the 401 refuses, from its body decoded (bounded); the account when the route has no rule. */
export async function unauthorizedOf(route: Route, proxyRes: http.IncomingMessage, peeked: Peeked): Promise<Unauthorized> {
  const rule = route.unauthorized;
  if (rule === null || rule === undefined) return 'account';
  const body = Buffer.concat(peeked.chunks);
  return rule(peeked.whole && body.length <= UNAUTHORIZED_BODY_MAX ? await decoded(body, proxyRes.headers['content-encoding']) : null);
}

/** A body decoded as its Content-Encoding says, at most UNAUTHORIZED_BODY_MAX bytes; null when it cannot be. */
async function decoded(body: Buffer, encoding: string | undefined): Promise<Buffer | null> {
  const decoders = decodersFor(encoding);
  if (decoders === null) return null;
  let out: Buffer | null = body;
  for (const decoder of decoders.list) if (out !== null) out = await through(decoder(), out);
  return out;
}

/** `input` through one decoder, whole; null when it fails or gives more than UNAUTHORIZED_BODY_MAX bytes. */
function through(decoder: Transform, input: Buffer): Promise<Buffer | null> {
  return new Promise((resolve) => {
    const out: Buffer[] = [];
    let size = 0;
    decoder.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > UNAUTHORIZED_BODY_MAX) {
        decoder.destroy();
        resolve(null);
      } else out.push(chunk);
    });
    decoder.on('error', () => resolve(null));
    decoder.on('end', () => resolve(Buffer.concat(out)));
    decoder.end(input);
  });
}

/**
 * The 401 as the relay takes it: its head, the bytes already read, then the
 * rest of the upstream's body as it comes (with its backpressure); a body
 * the upstream cut stays cut.
 */
export function replay(proxyRes: http.IncomingMessage, peeked: Peeked): http.IncomingMessage {
  const stand = new PassThrough();
  for (const chunk of peeked.chunks) stand.write(chunk);
  if (peeked.whole) stand.end();
  else if (proxyRes.destroyed) stand.destroy();
  else {
    proxyRes.on('close', () => {
      if (!proxyRes.complete) stand.destroy();
    });
    proxyRes.pipe(stand);
    proxyRes.resume();
  }
  proxyRes.on('error', (err) => stand.destroy(err));
  // The relay cuts the stand-in (a secret, a client gone): the upstream's body goes with it.
  stand.once('close', () => {
    if (!proxyRes.complete) proxyRes.destroy();
  });
  return Object.defineProperties(stand, {
    statusCode: { value: proxyRes.statusCode },
    statusMessage: { value: proxyRes.statusMessage },
    headers: { value: proxyRes.headers },
    rawHeaders: { value: proxyRes.rawHeaders },
    socket: { value: proxyRes.socket },
    complete: { get: () => proxyRes.complete },
  }) as unknown as http.IncomingMessage;
}
