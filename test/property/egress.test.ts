// The egress filter's body scan as a property: whatever the body and however
// it is cut into chunks, every secret is masked, nothing else changes, and
// the length stays the same (docs/security.md, "Upstream secrets never reach
// a client").
import assert from 'node:assert/strict';
import { test } from 'node:test';
import fc from 'fast-check';
import { BodyScan, maskHeaders, Secrets, type SecretForm } from '../../src/egress.ts';

const form = (text: string, name: string): SecretForm => ({ route: 'r', form: name, text, bytes: Buffer.from(text) });

/** The body with every occurrence of each secret masked, computed the slow, obvious way. */
function expected(body: Buffer, forms: readonly SecretForm[]): Buffer {
  const out = Buffer.from(body);
  for (const f of forms) for (let i = body.indexOf(f.bytes); i >= 0; i = body.indexOf(f.bytes, i + 1)) out.fill(0x2a, i, i + f.bytes.length);
  return out;
}

test('a body cut anywhere comes out with every secret masked, the same length, and nothing else changed', () => {
  const alphabet = fc.constantFrom(...'abcSEKRT*x'.split(''));
  fc.assert(
    fc.property(
      fc.array(fc.string({ unit: alphabet, minLength: 8, maxLength: 14 }), { minLength: 1, maxLength: 3 }),
      fc.array(fc.oneof(fc.string({ unit: alphabet, maxLength: 12 }), fc.constant('')), { maxLength: 12 }),
      fc.array(fc.integer({ min: 1, max: 9 }), { minLength: 1, maxLength: 30 }),
      (secrets, filler, cuts) => {
        const forms = [...new Set(secrets)].map((s, i) => form(s, `f${i}`)).sort((a, b) => b.bytes.length - a.bytes.length);
        // Secrets woven between filler pieces, so matches straddle chunk boundaries.
        const body = Buffer.from(filler.map((f, i) => f + (secrets[i % secrets.length] as string)).join(''));
        const scan = new BodyScan(new Secrets(forms));
        const parts: Buffer[] = [];
        let at = 0;
        for (let i = 0; at < body.length; i++) {
          const n = cuts[i % cuts.length] as number;
          parts.push(scan.push(body.subarray(at, at + n)));
          at += n;
        }
        parts.push(scan.end() ?? Buffer.alloc(0));
        const out = Buffer.concat(parts);
        assert.equal(out.length, body.length);
        assert.deepEqual(out, expected(body, forms));
        for (const f of forms) assert.equal(out.includes(f.bytes), false);
      },
    ),
    { numRuns: 400 },
  );
});

test('bytes held back at a chunk end are only a possible start of a secret, and come out with the next chunk', () => {
  const scan = new BodyScan(new Secrets([form('SECRETVALUE', 'k')]));
  assert.deepEqual(scan.push(Buffer.from('hello SEC')), Buffer.from('hello '));
  assert.equal(scan.holding, 3);
  assert.deepEqual(scan.push(Buffer.from('OND')), Buffer.from('SECOND'));
  assert.deepEqual(scan.push(Buffer.from('xx SECRET')), Buffer.from('xx '));
  assert.deepEqual(scan.push(Buffer.from('VALUE!')), Buffer.from('***********!'));
  assert.deepEqual(scan.found?.map((f) => f.form), ['k']);
  assert.deepEqual(scan.push(Buffer.from('tail S')), Buffer.from('tail '));
  assert.deepEqual(scan.end(), Buffer.from('S'));
});

test('header values are masked in place, the same length; a clean list is left alone', () => {
  const forms = [form('SECRETVALUE', 'k')];
  const clean = ['content-type', 'application/json', 'x-a', 'b'];
  assert.equal(maskHeaders(forms, clean), null);
  assert.deepEqual(clean, ['content-type', 'application/json', 'x-a', 'b']);
  const raw = ['x-echo', 'Bearer SECRETVALUE, again SECRETVALUE', 'set-cookie', 'k=SECRETVALUE'];
  assert.deepEqual(maskHeaders(forms, raw)?.map((f) => f.form), ['k']);
  assert.deepEqual(raw, ['x-echo', 'Bearer ***********, again ***********', 'set-cookie', 'k=***********']);
});
