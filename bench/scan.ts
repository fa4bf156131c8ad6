// What the egress filter's body scan costs per 10 MiB, beside the floor of
// its own loop (request/egress.ts, BodyScan): the same sampled windows read
// with nothing done to them, and read, folded, hashed and looked up in the
// window table with no branch taken. The filter can cost no less than the
// second line; what it may cost in place is a share of the gateway's CPU per
// stream (bench/README.md, "The filter's floor"). Each body goes through in
// 64 KiB chunks copied into one buffer first, as a socket read leaves them
// (the copy is measured alone and taken off); three lengths of the shortest
// secret, which sets how far apart the sampled windows are. Interleaved
// rounds, best of each, ms per 10 MiB.
//   node --import tsx bench/scan.ts [ROUNDS]
import { randomBytes } from 'node:crypto';
import { BodyScan, Secrets, secretForms } from '../src/request/egress.ts';
import { UPSTREAMS } from '../src/request/routes.ts';
import { WINDOW_MUL, WINDOW_SHIFT } from '../src/request/spellings.ts';
import { dataset } from './dataset.ts';

const ROUNDS = Number(process.argv[2] ?? 31);
const SIZE = 10 * 1024 * 1024;
const CHUNK = 64 * 1024;
const bodies: Readonly<Record<string, Buffer>> = { json: dataset(SIZE), binary: randomBytes(SIZE) };
const chunk = Buffer.alloc(CHUNK);
const view = new DataView(chunk.buffer, chunk.byteOffset, CHUNK);

/**
 * The providers' secrets of the sample shape with a tag of `n` hex digits:
 * the speech key is the shortest (`sk_` and the tag), so the shortest secret
 * is n + 3 characters long. 13: 16 characters; 21: the bench's own
 * secrets (bench/systems.ts); 48: a 51-character key, the speech
 * provider's real length.
 */
function secretsOfTag(n: number): Secrets {
  const tag = randomBytes(32).toString('hex').slice(0, n);
  const routes = UPSTREAMS.map((u) => ({ name: u.name, secretForms: u.secretForms(u.sampleSecrets(tag)) }));
  return new Secrets(secretForms(routes as never).forms);
}

/** One 4-byte read per sampled window, summed: the loop's floor with no table. */
function loads(stride: number): number {
  let sum = 0;
  for (let p = 0; p <= CHUNK - 4; p += stride) sum = (sum + view.getInt32(p, true)) | 0;
  return sum;
}

/** The read, fold, hash and table lookup of every sampled window, the bits summed: no branch per window. */
function lookups(stride: number, windows: Uint32Array): number {
  let hits = 0;
  for (let p = 0; p <= CHUNK - 4; p += stride) {
    const slot = Math.imul(view.getInt32(p, true) | 0x20202020, WINDOW_MUL) >>> WINDOW_SHIFT;
    hits += ((windows[slot >>> 5] as number) >>> (slot & 31)) & 1;
  }
  return hits;
}

type Pass = (body: Buffer) => number;

/** Every chunk of `body` copied into the one buffer, then `each` on it. */
const over =
  (each: () => number): Pass =>
  (body) => {
    let out = 0;
    for (let at = 0; at < body.length; at += CHUNK) {
      body.copy(chunk, 0, at, at + CHUNK);
      out += each();
    }
    return out;
  };

const rows: Record<string, unknown>[] = [];
for (const tagLength of [13, 21, 48]) {
  const secrets = secretsOfTag(tagLength);
  let sink = 0;
  const passes: Readonly<Record<string, Pass>> = {
    copy: over(() => 0),
    loads: over(() => loads(secrets.stride)),
    lookups: over(() => lookups(secrets.stride, secrets.windows)),
    matches: (body) => {
      const scan = new BodyScan(secrets);
      return over(() => scan.matches(chunk)?.length ?? 0)(body);
    },
    filter: (body) => {
      const scan = new BodyScan(secrets);
      return over(() => {
        scan.pushTo(chunk, (out) => (sink += out.length));
        return 0;
      })(body);
    },
  };
  const best: Record<string, number> = {};
  // Three rounds unrecorded first: every pass compiled for this stride.
  for (let round = -3; round < ROUNDS; round++) {
    for (const [bodyName, body] of Object.entries(bodies)) {
      for (const [passName, pass] of Object.entries(passes)) {
        const start = process.hrtime.bigint();
        sink += pass(body);
        const ms = Number(process.hrtime.bigint() - start) / 1e6;
        const key = `${bodyName} ${passName}`;
        if (round >= 0) best[key] = Math.min(best[key] ?? Infinity, ms);
      }
    }
  }
  for (const bodyName of Object.keys(bodies)) {
    const copy = best[`${bodyName} copy`] as number;
    const net = (pass: string): number => Math.round(((best[`${bodyName} ${pass}`] as number) - copy) * 100) / 100;
    rows.push({
      shortest: secrets.shortest,
      stride: secrets.stride,
      body: bodyName,
      copyMs: Math.round(copy * 100) / 100,
      loadsMs: net('loads'),
      lookupsMs: net('lookups'),
      matchesMs: net('matches'),
      filterMs: net('filter'),
    });
  }
  // Every result is used, so V8 cannot drop a pass as dead code.
  if (sink === 0.5) process.stdout.write('');
}
for (const row of rows) process.stdout.write(`${JSON.stringify(row)}\n`);
