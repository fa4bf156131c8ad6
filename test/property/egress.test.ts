// The egress filter's body scan as a property: whatever the body and however
// it is cut into chunks, every secret is masked, nothing else changes, and
// the length stays the same (docs/security.md, "Upstream secrets never reach
// a client").
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { BodyScan, maskHeaders, secretForm, secretForms, secretsByOrigin, Secrets, type SecretForm } from '../../src/request/egress.ts';
import { loadConfig } from '../../src/config/load.ts';
import { UPSTREAMS } from '../../src/request/routes.ts';
import { base64Middles, everySpellingOf, searchRun, spellingsOf } from '../../src/request/spellings.ts';

const form = (text: string, name: string): SecretForm => secretForm('r', name, text);

/** The body with every occurrence of each secret (in any letter case) masked, computed the slow, obvious way. */
function expected(body: Buffer, forms: readonly SecretForm[]): Buffer {
  const out = Buffer.from(body);
  const folded = Buffer.from(body.toString('latin1').toLowerCase(), 'latin1');
  for (const f of forms) {
    const s = Buffer.from(f.folded);
    for (let i = folded.indexOf(s); i >= 0; i = folded.indexOf(s, i + 1)) out.fill(0x2a, i, i + s.length);
  }
  return out;
}

/** Push `body` through a scan cut at the given lengths (repeated); what the client would receive. */
function through(scan: BodyScan, body: Buffer, cuts: readonly number[]): Buffer {
  const parts: Buffer[] = [];
  let at = 0;
  for (let i = 0; at < body.length; i++) {
    const n = cuts[i % cuts.length] as number;
    parts.push(scan.push(body.subarray(at, at + n)));
    at += n;
  }
  parts.push(scan.end() ?? Buffer.alloc(0));
  return Buffer.concat(parts);
}

test('a body cut anywhere comes out with every secret masked, the same length, and nothing else changed', () => {
  const alphabet = fc.constantFrom(...'abcSEKRT*x'.split(''));
  fc.assert(
    fc.property(
      fc.array(fc.string({ unit: alphabet, minLength: 8, maxLength: 14 }), { minLength: 1, maxLength: 3 }),
      fc.array(fc.oneof(fc.string({ unit: alphabet, maxLength: 12 }), fc.constant('')), { maxLength: 12 }),
      fc.array(fc.integer({ min: 1, max: 9 }), { minLength: 1, maxLength: 30 }),
      (secrets, filler, cuts) => {
        const forms = [...new Set(secrets)].map((s, i) => form(s, `f${i}`)).sort((a, b) => b.folded.length - a.folded.length);
        // Secrets woven between filler pieces, so matches straddle chunk boundaries.
        const body = Buffer.from(filler.map((f, i) => f + (secrets[i % secrets.length] as string)).join(''));
        const out = through(new BodyScan(new Secrets(forms)), body, cuts);
        assert.equal(out.length, body.length);
        assert.deepEqual(out, expected(body, forms));
        for (const f of forms) assert.equal(out.toString('latin1').toLowerCase().includes(f.folded), false);
      },
    ),
    { numRuns: 400 },
  );
});

/** The same through pushTo, as the relays stream a body: every part it writes, in order. */
function throughTo(scan: BodyScan, body: Buffer, cuts: readonly number[]): { out: Buffer; parts: Buffer[] } {
  const parts: Buffer[] = [];
  let at = 0;
  for (let i = 0; at < body.length; i++) {
    const n = cuts[i % cuts.length] as number;
    scan.pushTo(body.subarray(at, at + n), (out) => parts.push(out));
    at += n;
  }
  parts.push(scan.end() ?? Buffer.alloc(0));
  return { out: Buffer.concat(parts), parts };
}

test('pushTo, with chunks longer than any spelling and every chunk ending in a possible start, masks what push masks', () => {
  // Runs of `s`, each one a possible start of every secret here, so a tail is held at almost every chunk end and
  // the next chunk is scanned where it lies, beside a joint of the held bytes and its first bytes. The body is cut
  // inside the secrets, so that one begins in the held bytes and ends in the next chunk.
  const alphabet = fc.constantFrom(...'sSeEkKrRt*x '.split(''));
  fc.assert(
    fc.property(
      fc.array(fc.string({ unit: fc.constantFrom(...'sekrtSEKRT'.split('')), minLength: 8, maxLength: 12 }), { minLength: 1, maxLength: 3 }),
      fc.array(
        fc.oneof(
          fc.string({ unit: alphabet, maxLength: 40 }),
          fc.integer({ min: 1, max: 1500 }).map((n) => 's'.repeat(n)),
        ),
        { maxLength: 10 },
      ),
      fc.array(fc.integer({ min: 0, max: 12 }), { minLength: 1, maxLength: 10 }),
      (raw, filler, into) => {
        const secrets = raw.map((x) => `s${x}`);
        const forms = [...new Set(secrets.map((x) => x.toLowerCase()))].map((x, i) => form(x, `f${i}`)).sort((a, b) => b.folded.length - a.folded.length);
        let text = '';
        const cutsAt: number[] = [];
        filler.forEach((f, i) => {
          text += f;
          // A cut this far into the secret that follows (0: at its start).
          cutsAt.push(text.length + (into[i % into.length] as number));
          text += secrets[i % secrets.length] as string;
        });
        const body = Buffer.from(text);
        const cuts: number[] = [];
        let at = 0;
        for (const c of cutsAt.filter((c) => c > 0 && c < body.length)) {
          if (c > at) cuts.push(c - at);
          at = Math.max(at, c);
        }
        cuts.push(Math.max(1, body.length - at));
        const { out } = throughTo(new BodyScan(new Secrets(forms)), body, cuts);
        assert.equal(out.length, body.length);
        assert.deepEqual(out, expected(body, forms));
      },
    ),
    { numRuns: 400 },
  );
});

test('pushTo sends a clean chunk after a held tail as it came, not a copy', () => {
  const scan = new BodyScan(new Secrets([form('apify_api_SECRETVALUE', 'k')]));
  const first = Buffer.from('a'.repeat(5000));
  const second = Buffer.from('a'.repeat(5000));
  const { parts } = throughTo(scan, Buffer.concat([first, second]), [5000]);
  // The first chunk less its held `a`, then that `a` and the second chunk less its own, then the last `a` at the end.
  assert.deepEqual(
    parts.map((p) => p.length),
    [4999, 1, 4999, 1],
  );
  const chunk = Buffer.from(`${'a'.repeat(4000)} x`);
  const scan2 = new BodyScan(new Secrets([form('apify_api_SECRETVALUE', 'k')]));
  scan2.pushTo(Buffer.from('xa'), () => undefined);
  const sent: Buffer[] = [];
  scan2.pushTo(chunk, (p) => sent.push(p));
  assert.equal(sent[1]?.buffer, chunk.buffer, 'the chunk itself, not a copy');
  // A secret that begins in the held bytes is masked across the joint.
  const scan3 = new BodyScan(new Secrets([form('apify_api_SECRETVALUE', 'k')]));
  const { out } = throughTo(scan3, Buffer.from(`${'a'.repeat(3000)}pify_api_SECRETVALUE${'a'.repeat(3000)}`), [3000]);
  assert.equal(out.toString().includes('SECRET'), false);
  assert.equal(out.length, 6020);
});

test('bytes held back at a chunk end are only a possible start of a secret, and come out with the next chunk', () => {
  const scan = new BodyScan(new Secrets([form('SECRETVALUE', 'k')]));
  assert.deepEqual(scan.push(Buffer.from('hello SEC')), Buffer.from('hello '));
  assert.equal(scan.holding, 3);
  assert.deepEqual(scan.push(Buffer.from('OND')), Buffer.from('SECOND'));
  assert.deepEqual(scan.push(Buffer.from('xx SECRET')), Buffer.from('xx '));
  assert.deepEqual(scan.push(Buffer.from('VALUE!')), Buffer.from('***********!'));
  assert.deepEqual(
    scan.found?.map((f) => f.form),
    ['k'],
  );
  assert.deepEqual(scan.push(Buffer.from('tail S')), Buffer.from('tail '));
  assert.deepEqual(scan.end(), Buffer.from('S'));
});

test('header values are masked in place, the same length; a clean list is left alone', () => {
  const forms = [form('SECRETVALUE', 'k')];
  const clean = ['content-type', 'application/json', 'x-a', 'b'];
  assert.equal(maskHeaders(new Secrets(forms), clean), null);
  assert.deepEqual(clean, ['content-type', 'application/json', 'x-a', 'b']);
  const raw = ['x-echo', 'Bearer SECRETVALUE, again SECRETVALUE', 'set-cookie', 'k=SECRETVALUE'];
  assert.deepEqual(
    maskHeaders(new Secrets(forms), raw)?.map((f) => f.form),
    ['k'],
  );
  assert.deepEqual(raw, ['x-echo', 'Bearer ***********, again ***********', 'set-cookie', 'k=***********']);
});

// Every spelling an upstream could plausibly echo a secret in (docs/security.md,
// "Each form a secret can take"): each character independently as itself in
// either case, percent-encoded, `\u00XX`, `\xXX`, an HTML entity (either hex
// case, with or without leading zeros), `/` as `\/`, all of it in UTF-16.
const SECRET_CHARS = fc.constantFrom(...'abcdefghijklmnopqrstuvwxyz0123456789_-/+=.@'.split(''));
/** Filler that is hostile to a scanner: escape introducers, hex digits, bytes of the secret's own alphabet. */
const FILLER = fc.string({ unit: fc.constantFrom(...'%\\&#;xu0a1F, "\n'.split('')), maxLength: 10 });

function spell(secret: string, picks: readonly number[], utf16: 0 | 1 | 2): Buffer {
  let text = '';
  for (let i = 0; i < secret.length; i++) {
    const options = spellingsOf(secret[i] as string);
    text += options[(picks[i % picks.length] as number) % options.length];
  }
  if (utf16 === 0) return Buffer.from(text, 'latin1');
  const le = Buffer.from(text, 'utf16le');
  return utf16 === 1 ? le : le.swap16();
}

test('a secret in any mix of spellings, cut anywhere, comes out masked whole; nothing else changes', () => {
  fc.assert(
    fc.property(
      fc.string({ unit: SECRET_CHARS, minLength: 8, maxLength: 24 }),
      fc.array(fc.nat(), { minLength: 1, maxLength: 24 }),
      fc.constantFrom<0 | 1 | 2>(0, 0, 0, 1, 2),
      FILLER,
      FILLER,
      fc.array(fc.integer({ min: 1, max: 13 }), { minLength: 1, maxLength: 20 }),
      (secret, picks, utf16, before, after, randomCuts) => {
        const spelled = spell(secret, picks, utf16);
        const body = Buffer.concat([Buffer.from(before, 'latin1'), spelled, Buffer.from(after, 'latin1')]);
        for (const cuts of [[body.length], [1], randomCuts]) {
          const out = through(new BodyScan(new Secrets([form(secret, 's')])), body, cuts);
          assert.equal(out.length, body.length);
          const at = before.length;
          // A NUL before the first character or after the last (UTF-16) is no part of the secret; every other byte is masked.
          assert.ok(
            out.subarray(at, at + spelled.length).every((b) => b === 0x2a || b === 0),
            `${JSON.stringify(spelled.toString('latin1'))} cut ${cuts} -> ${JSON.stringify(out.toString('latin1'))}`,
          );
          for (let i = 0; i < body.length; i++) if (out[i] !== 0x2a) assert.equal(out[i], body[i]);
        }
      },
    ),
    { numRuns: 600 },
  );
});

test('a secret in base64 (standard or URL alphabet) at any offset inside longer base64 is masked', () => {
  fc.assert(
    fc.property(
      fc.string({ unit: SECRET_CHARS, minLength: 8, maxLength: 30 }),
      fc.uint8Array({ maxLength: 7 }),
      fc.uint8Array({ maxLength: 7 }),
      fc.boolean(),
      fc.array(fc.integer({ min: 1, max: 11 }), { minLength: 1, maxLength: 10 }),
      (secret, pre, post, url, cuts) => {
        const forms = [form(secret, 's'), ...base64Middles(secret).map((b) => form(b, 's base64'))];
        const encoded = Buffer.concat([Buffer.from(pre), Buffer.from(secret), Buffer.from(post)]).toString(url ? 'base64url' : 'base64');
        const body = Buffer.from(`session=${encoded}; Path=/`);
        const out = through(new BodyScan(new Secrets(forms)), body, cuts).toString('latin1');
        assert.equal(out.length, body.length);
        // What is left decodes to no secret, at any alignment.
        const left = out.slice('session='.length, out.length - '; Path=/'.length).replace(/\*/g, 'A');
        for (let k = 0; k < 4; k++) assert.equal(Buffer.from(left.slice(k), url ? 'base64url' : 'base64').includes(secret), false);
        assert.ok(out.includes('*'));
      },
    ),
    { numRuns: 400 },
  );
});

test('the forms the issue reports reaching a client readable are masked, in headers too', () => {
  const token = 'apify_api_Z3xQ9kT2mW8vR4nB7cY1';
  const basic = Buffer.from('login@example.com:p4ss/w0rd+Xy=').toString('base64');
  const secrets = new Secrets([
    form(token, 'token'),
    form(basic, 'basic'),
    form('p4ss/w0rd+Xy=', 'password'),
    ...base64Middles(token).map((b) => form(b, 'token base64')),
  ]);
  const pct = [...token].map((c) => `%${c.charCodeAt(0).toString(16)}`).join('');
  const bodies = [
    pct,
    pct.toUpperCase(),
    token.replace(/_/g, '%5F'),
    token.replace(/_/g, '%5f'),
    [...token].map((c) => `\\u00${c.charCodeAt(0).toString(16)}`).join(''),
    token.replace(/_/g, '\\u005f'),
    token.toUpperCase(),
    'P4SS/W0RD+XY=',
    basic.replace(/=/g, '%3D'),
    basic.replace(/\//g, '\\/'),
    Buffer.from(token, 'utf16le').toString('latin1'),
    [...token].map((c) => `&#${c.charCodeAt(0)};`).join(''),
    token.replace(/_/g, '&lowbar;'),
  ];
  for (const b of bodies) {
    const out = through(new BodyScan(secrets), Buffer.from(`x ${b} y`, 'latin1'), [5]).toString('latin1');
    // (UTF-16's NUL after the last character is no part of it.)
    assert.equal(out.replace(/\0/g, '*'), `x ${'*'.repeat(b.length)} y`, b);
  }
  // In base64 only the characters that depend on the secret alone are masked; what is left decodes to none of it.
  const b64 = Buffer.from(`{"t":"${token}"}`).toString('base64');
  const left = through(new BodyScan(secrets), Buffer.from(b64), [5]).toString('latin1');
  assert.notEqual(left, b64);
  assert.equal(Buffer.from(left.replace(/\*/g, 'A'), 'base64').includes(token), false);
  const raw = ['location', `/cb?t=${pct}`, 'set-cookie', `s=${Buffer.from(token).toString('base64')}`];
  const found = maskHeaders(secrets, raw);
  assert.ok(found !== null && found.length >= 2);
  assert.equal(raw[1], `/cb?t=${'*'.repeat(pct.length)}`);
  assert.ok(!Buffer.from((raw[3] as string).slice(2).replace(/\*/g, 'A'), 'base64').includes(token));
});

// The scan reads a sampled window every few bytes and decodes only around
// the ones a spelling could hold (docs/security.md, "How the scan reads a
// body"); the full decoder reads every byte. On random bytes and on text
// like an API's JSON, with secrets planted in every mix of spellings
// (leading zeros of entities included), both find exactly the same
// occurrences, and a header value the text check passes over holds none.
const TEXT = fc.string({ unit: fc.constantFrom(...' abcdefghijklmnopqrstuvwxyz0123456789ABCDEFXYZ"{}[]:,./-_\\%&#;=+\n'.split('')), maxLength: 400 });
const BYTES = fc.uint8Array({ maxLength: 400 }).map((a) => Buffer.from(a).toString('latin1'));

function planted(secret: string, picks: readonly number[], utf16: 0 | 1 | 2): string {
  let text = '';
  for (let i = 0; i < secret.length; i++) {
    const options = everySpellingOf(secret[i] as string);
    const spelled = options[(picks[i % picks.length] as number) % options.length] as string;
    // Hex digits, `x` and letters in either case; a named entity only as it is named.
    const upper = (picks[(i + 1) % picks.length] as number) % 2 === 1 && !/^&[A-Za-z]/.test(spelled);
    text += upper ? spelled.toUpperCase().replace(/\\U/g, '\\u').replace(/\\X/g, '\\x') : spelled;
  }
  if (utf16 === 0) return text;
  const le = Buffer.from(text, 'utf16le');
  return (utf16 === 1 ? le : le.swap16()).toString('latin1');
}

test('the sampled scan and the full decoder find the same occurrences, on bytes and text with secrets planted in any mix', () => {
  fc.assert(
    fc.property(
      fc.array(fc.string({ unit: SECRET_CHARS, minLength: 8, maxLength: 30 }), { minLength: 1, maxLength: 3 }),
      fc.array(fc.tuple(fc.oneof(TEXT, BYTES), fc.nat(), fc.array(fc.nat(), { minLength: 1, maxLength: 8 }), fc.constantFrom<0 | 1 | 2>(0, 0, 0, 1, 2)), {
        minLength: 1,
        maxLength: 6,
      }),
      (secrets, pieces) => {
        const forms = [...new Set(secrets)].map((s, i) => form(s, `f${i}`)).sort((a, b) => b.folded.length - a.folded.length);
        const body = Buffer.from(
          pieces.map(([filler, which, picks, utf16]) => filler + planted(secrets[which % secrets.length] as string, picks, utf16)).join(''),
          'latin1',
        );
        const found = new BodyScan(new Secrets(forms)).matches(body) ?? [];
        const all: Array<[number, number, string]> = [];
        searchRun(body, 0, body.length, forms, (f, from, to) => all.push([from, to, f.form]));
        const key = (m: readonly [number, number, string]): string => `${m[0]}-${m[1]}-${m[2]}`;
        assert.deepEqual(new Set(found.map((m) => key([m[0], m[1], m[2].form]))), new Set(all.map(key)));
        assert.ok(all.length >= 1);
        // As header text: a value that holds an occurrence is always read in full.
        const raw = ['x-echo', body.toString('latin1')];
        assert.notEqual(maskHeaders(new Secrets(forms), raw), null);
      },
    ),
    { numRuns: 400 },
  );
});

// The scan stops at each candidate window and resumes past it (egress.ts,
// sample). In a body where every sampled window is a candidate that holds
// no secret (a lone NUL among bytes no spelling holds), a secret planted in
// any spelling (as it is, most often: then it holds a single sampled
// window) at every offset across three strides is found there whole, and
// nothing outside it.
test('a secret is found at every offset among candidate windows the scan stops at and turns away', () => {
  fc.assert(
    fc.property(
      fc.string({ unit: SECRET_CHARS, minLength: 8, maxLength: 30 }),
      fc.option(fc.tuple(fc.array(fc.nat(), { minLength: 1, maxLength: 8 }), fc.constantFrom<0 | 1 | 2>(0, 1, 2)), { freq: 2 }),
      (secret, spelling) => {
        const secrets = new Secrets([form(secret, 'f')]);
        const spelled = Buffer.from(spelling === null ? secret : planted(secret, spelling[0], spelling[1]), 'latin1');
        const decoys = Buffer.alloc(6 * secrets.stride + 2 * spelled.length);
        for (let i = 0; i < decoys.length; i++) decoys[i] = [0x01, 0x00, 0x02, 0x03][i % 4] as number;
        // Every window of the background holds one NUL and no two side by side: each is a candidate.
        const stops = (decoys.length - 4) / secrets.stride;
        assert.ok(stops >= 6);
        const body = Buffer.alloc(decoys.length);
        for (let at = secrets.stride; at <= 3 * secrets.stride; at++) {
          decoys.copy(body);
          // A byte past 0x7f on each side: nothing around the secret can lengthen the occurrence.
          body[at - 1] = 0x80;
          spelled.copy(body, at);
          body[at + spelled.length] = 0x80;
          const found = new BodyScan(secrets).matches(body) ?? [];
          // Found whole (a UTF-16 spelling's outermost NUL may fall outside it), and nothing outside it.
          const whole =
            found.some(([from, to]) => from <= at + 1 && to >= at + spelled.length - 1) && found.every(([from, to]) => from >= at && to <= at + spelled.length);
          assert.ok(whole, `planted at ${at}, stride ${secrets.stride}: found ${found.map((m) => `${m[0]}-${m[1]}`).join(', ') || 'nothing'}`);
        }
      },
    ),
    { numRuns: 60 },
  );
});

// The scan passes over a window holding a byte past 0x7f without reading
// its table (egress.ts, Secrets.high) only when every spelling is ASCII: a
// secret with a character past it is found among such bytes.
test('a secret past ASCII is found among bytes past 0x7f: the pass-over is on for ASCII secrets only', () => {
  fc.assert(
    fc.property(fc.string({ unit: fc.constantFrom(...'abcxyz019_-äéøß'.split('')), minLength: 10, maxLength: 20 }), fc.nat({ max: 300 }), (secret, at) => {
      const secrets = new Secrets([form(secret, 'f')]);
      const body = Buffer.alloc(at + secret.length + 300, 0x9c);
      Buffer.from(secret, 'latin1').copy(body, at);
      const found = new BodyScan(secrets).matches(body) ?? [];
      assert.ok(
        found.some(([from, to]) => from === at && to === at + secret.length),
        `${JSON.stringify(secret)} at ${at}: ${JSON.stringify(found.map((m) => [m[0], m[1]]))}`,
      );
      assert.equal(
        secrets.high === 0,
        [...secret].some((c) => c.charCodeAt(0) > 0x7f),
      );
    }),
    { numRuns: 200 },
  );
});

test('several credentials per route: whichever credential served a response, every credential of every route is masked in it (docs/credentials.md)', () => {
  const secretText = fc.string({ unit: fc.constantFrom(...'abcdefXYZ0123_'.split('')), minLength: 10, maxLength: 24 });
  fc.assert(
    fc.property(
      fc.array(secretText, { minLength: 1, maxLength: 4 }),
      fc.array(secretText, { minLength: 1, maxLength: 3 }),
      fc.array(fc.string({ maxLength: 10 }), { maxLength: 10 }),
      fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 20 }),
      (speech, scraper, filler, cuts) => {
        const keys = [...new Set(speech.map((s) => `sk_${s}`))];
        const tokens = [...new Set(scraper.map((s) => `apify_api_${s}`))];
        const env: Record<string, string> = {};
        keys.forEach((k, i) => (env[i === 0 ? 'KEYWARD_SPEECH_KEY' : `KEYWARD_SPEECH_KEY_${i + 1}`] = k));
        tokens.forEach((t, i) => (env[i === 0 ? 'KEYWARD_SCRAPER_TOKEN' : `KEYWARD_SCRAPER_TOKEN_${i + 1}`] = t));
        const config = loadConfig(env, () => '', '/', UPSTREAMS);
        const all = [...keys, ...tokens];
        const body = Buffer.from(filler.map((f, i) => f + (all[i % all.length] as string)).join('') + all.join(' '));
        const out = through(new BodyScan(new Secrets(secretForms(config.routes).forms)), body, cuts).toString('latin1');
        assert.equal(out.length, body.length);
        for (const s of all) assert.equal(out.includes(s), false, 'a credential reached the client');
      },
    ),
    { numRuns: 100 },
  );
});

test('one table per upstream origin: an answer from origin O never carries any spelling of any secret sent to O, every route and credential on it (docs/security.md)', () => {
  const origins = ['http://127.0.0.1:7001', 'http://127.0.0.1:7002', 'https://upstream.example'];
  const secretText = fc.string({ unit: SECRET_CHARS, minLength: 10, maxLength: 20 });
  fc.assert(
    fc.property(
      fc.tuple(fc.nat(2), fc.nat(2), fc.nat(2)),
      fc.array(secretText, { minLength: 1, maxLength: 3 }),
      fc.array(secretText, { minLength: 1, maxLength: 2 }),
      fc.array(secretText, { minLength: 1, maxLength: 2 }),
      fc.array(fc.nat(), { minLength: 1, maxLength: 24 }),
      fc.constantFrom<0 | 1 | 2>(0, 0, 1, 2),
      fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 20 }),
      ([scraperAt, seoAt, speechAt], speech, scraper, passwords, picks, utf16, cuts) => {
        const env: Record<string, string> = {
          KEYWARD_SCRAPER_URL: origins[scraperAt] as string,
          KEYWARD_SEO_URL: origins[seoAt] as string,
          KEYWARD_SPEECH_URL: origins[speechAt] as string,
        };
        const keys = [...new Set(speech.map((s) => `sk_${s}`))];
        const tokens = [...new Set(scraper.map((s) => `apify_api_${s}`))];
        const logins = [...new Set(passwords)].map((p, i) => ({ login: `login${i}@example.com`, password: `pw_${p}` }));
        keys.forEach((k, i) => (env[i === 0 ? 'KEYWARD_SPEECH_KEY' : `KEYWARD_SPEECH_KEY_${i + 1}`] = k));
        tokens.forEach((t, i) => (env[i === 0 ? 'KEYWARD_SCRAPER_TOKEN' : `KEYWARD_SCRAPER_TOKEN_${i + 1}`] = t));
        logins.forEach(({ login, password }, i) => {
          env[i === 0 ? 'KEYWARD_SEO_LOGIN' : `KEYWARD_SEO_LOGIN_${i + 1}`] = login;
          env[i === 0 ? 'KEYWARD_SEO_PASSWORD' : `KEYWARD_SEO_PASSWORD_${i + 1}`] = password;
        });
        const config = loadConfig(env, () => '', '/', UPSTREAMS);
        const tables = secretsByOrigin(config.routes, true);
        for (const origin of new Set(config.routes.map((r) => r.target.origin))) {
          const on = config.routes.filter((r) => r.target.origin === origin);
          const table = tables.get(origin) as Secrets;
          // Exactly the forms sent to this origin: every credential of every route on it, and no other.
          assert.deepEqual(new Set(table.forms.map((f) => f.folded)), new Set(secretForms(on).forms.map((f) => f.folded)));
          const sent = on.flatMap((r) => r.secretForms.map((f) => f.value));
          const body = Buffer.concat(sent.flatMap((s) => [Buffer.from(' x '), spell(s, picks, utf16)]));
          const out = through(new BodyScan(table), body, cuts);
          assert.equal(out.length, body.length);
          // Every planted spelling is masked whole: nothing of it is left between the separators.
          let at = 0;
          for (const s of sent) {
            at += 3;
            const n = spell(s, picks, utf16).length;
            assert.ok(
              out.subarray(at, at + n).every((b) => b === 0x2a || b === 0),
              `${origin}: ${s} left in ${JSON.stringify(out.toString('latin1'))}`,
            );
            at += n;
          }
        }
      },
    ),
    { numRuns: 100 },
  );
});
