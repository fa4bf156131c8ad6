// Holds an admin API answer to the OpenAPI document it serves (src/admin/openapi.ts):
// the schema of that path, method, status and media type, JSON Schema 2020-12
// as OpenAPI 3.1 uses it, with formats (date-time) checked.
import assert from 'node:assert/strict';
import { Ajv2020 } from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { OPENAPI } from '../../src/admin/openapi.ts';

const ID = 'https://keyward.invalid/openapi.json';
const ajv = new Ajv2020({ strict: false, allErrors: true });
(addFormats as unknown as (a: Ajv2020) => void)(ajv);
ajv.addSchema({ ...OPENAPI, $id: ID });

const pointer = (parts: readonly string[]): string => parts.map((p) => p.replace(/~/g, '~0').replace(/\//g, '~1')).join('/');

/** Every (path, method, status) the document names, as `GET /v1/keys 200`. */
export function documented(): string[] {
  const out: string[] = [];
  for (const [path, item] of Object.entries(OPENAPI.paths as Record<string, Record<string, unknown>>)) {
    for (const [method, op] of Object.entries(item)) {
      if (method === 'parameters') continue;
      for (const status of Object.keys((op as { responses: Record<string, unknown> }).responses)) out.push(`${method.toUpperCase()} ${path} ${status}`);
    }
  }
  return out;
}

/** Assert that `body` is what the document says `method path` answers with `status` (JSON unless `media`). */
export function conforms(method: string, path: string, status: number, body: unknown, media = 'application/json'): string {
  const op = (OPENAPI.paths as unknown as Record<string, Record<string, { responses: Record<string, { content?: Record<string, unknown> }> }>>)[path]?.[
    method.toLowerCase()
  ];
  assert.ok(op !== undefined, `${method} ${path} is not in the OpenAPI document`);
  const response = op.responses[String(status)];
  assert.ok(response !== undefined, `${method} ${path} answered ${status}, which the OpenAPI document does not name`);
  assert.ok(response.content?.[media] !== undefined, `${method} ${path} ${status} has no ${media} content in the document`);
  const ref = `${ID}#/${pointer(['paths', path, method.toLowerCase(), 'responses', String(status), 'content', media, 'schema'])}`;
  const validate = ajv.getSchema(ref) ?? ajv.compile({ $ref: ref });
  const ok = validate(body);
  assert.ok(ok, `${method} ${path} ${status} does not conform: ${ajv.errorsText(validate.errors)}\n${JSON.stringify(body).slice(0, 800)}`);
  return `${method} ${path} ${status}`;
}

/** The document's path for a request path: `/v1/keys/key_1/rotate` is `/v1/keys/{id}/rotate`. */
export function template(path: string): string {
  const p = path.split('?')[0] as string;
  const m = /^\/v1\/keys\/[^/]+(\/rotate|\/revoke)?$/.exec(p);
  return m === null ? p : `/v1/keys/{id}${m[1] ?? ''}`;
}
