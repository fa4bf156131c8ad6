// The admin API's OpenAPI 3.1 document (docs/admin-api.md), served at
// /v1/openapi.json. The tests validate every answer of every endpoint
// against it (JSON Schema 2020-12, unknown properties refused), so the
// document cannot drift from the code.

const nullable = (schema: Record<string, unknown>): Record<string, unknown> => ({ oneOf: [schema, { type: 'null' }] });
const instant = { type: 'string', format: 'date-time' };
const ref = (name: string): { $ref: string } => ({ $ref: `#/components/schemas/${name}` });
const json = (schema: unknown): unknown => ({ 'application/json': { schema } });
const error = (description: string): unknown => ({ description, content: json(ref('Error')) });

const ERRORS = {
  '400': error('A query parameter the endpoint does not know, or one given twice (every endpoint), or a bad value; `field` names it.'),
  '401': error('No admin token, a client key, or an unknown or revoked admin token.'),
  '503': error('The key store could not be read or written; nothing was changed.'),
};
const WRITE_ERRORS = {
  ...ERRORS,
  '400': error('A field, value or query parameter the CLI would refuse, unknown or given twice; `field` names it.'),
  '403': error('An admin token of role read.'),
  '413': error('A body above 64 KiB.'),
  '415': error('A body whose Content-Type is not JSON.'),
};

const KEY_PROPERTIES = {
  id: { type: 'string' },
  name: { type: 'string' },
  externalId: nullable({ type: 'string' }),
  routes: nullable({ type: 'array', items: { type: 'string' } }),
  created: instant,
  expires: nullable(instant),
  revoked: nullable(instant),
  lastUsed: nullable(instant),
  limits: nullable(ref('Limits')),
  unsupported: { type: 'string', description: 'Written by a newer keyward with rules this one cannot enforce.' },
};
const KEY_REQUIRED = ['id', 'name', 'externalId', 'routes', 'created', 'expires', 'revoked', 'lastUsed', 'limits'];
const key = (extra: Record<string, unknown>, required: readonly string[] = []): Record<string, unknown> => ({
  type: 'object',
  properties: { ...KEY_PROPERTIES, ...extra },
  required: [...KEY_REQUIRED, ...required],
  additionalProperties: false,
});
const STATE = { type: 'string', enum: ['active', 'revoked', 'expired'] };

/** The body of `POST /v1/keys`; `PATCH` takes the same fields but `name`, each nullable (null removes). */
const KEY_FIELDS = {
  routes: { type: 'array', items: { type: 'string' }, minItems: 1 },
  expiresIn: { type: 'string', description: 'A duration: 12h, 30d (at most 3652d).' },
  rate: { type: 'string', description: 'N/s, N/m or N/h.' },
  burst: { type: 'integer', minimum: 1 },
  concurrency: { type: 'integer', minimum: 1 },
  quota: { type: 'string', description: 'N/day or N/month.' },
  budgets: { type: 'object', additionalProperties: { type: 'string' }, description: 'route: "AMOUNT/day" or "AMOUNT/month".' },
  alertAt: { type: 'array', items: { type: 'integer', minimum: 1, maximum: 100 } },
  runCap: { type: 'number', exclusiveMinimum: 0 },
  allowFrom: { type: 'array', items: { type: 'string' }, minItems: 1 },
  externalId: { type: 'string', minLength: 1, maxLength: 128 },
};
const PATCH_FIELDS = Object.fromEntries(Object.entries(KEY_FIELDS).map(([k, v]) => [k, nullable(v)]));

const USAGE_ROW = {
  type: 'object',
  properties: {
    keyId: { type: 'string' },
    key: nullable({ type: 'string' }),
    route: { type: 'string' },
    day: { type: 'string', description: 'A UTC day (2026-11-27), or a month (2026-11) with by=month.' },
    requests: { type: 'integer' },
    status: ref('StatusCounts'),
    limited: { type: 'integer' },
    bytesIn: { type: 'integer' },
    bytesOut: { type: 'integer' },
    cost: { type: 'number' },
    costUnit: nullable({ type: 'string' }),
    pendingRuns: { type: 'integer' },
  },
  required: ['keyId', 'key', 'route', 'day', 'requests', 'status', 'limited', 'bytesIn', 'bytesOut', 'cost', 'costUnit', 'pendingRuns'],
  additionalProperties: false,
};
const CREDENTIAL_ROW = {
  type: 'object',
  properties: {
    route: { type: 'string' },
    credential: { type: 'integer' },
    day: { type: 'string' },
    requests: { type: 'integer' },
    status: ref('StatusCounts'),
    cost: { type: 'number' },
    costUnit: nullable({ type: 'string' }),
  },
  required: ['route', 'credential', 'day', 'requests', 'status', 'cost', 'costUnit'],
  additionalProperties: false,
};

const keyId = { name: 'id', in: 'path', required: true, description: 'The key id, or ext:<externalId>.', schema: { type: 'string' } };

export const OPENAPI = {
  openapi: '3.1.0',
  info: {
    title: 'keyward admin API',
    version: '1',
    description: 'Keys, usage and the audit log, on the admin listener. Every request needs Authorization: Bearer <admin token> (keyward admins create).',
  },
  security: [{ admin: [] }],
  paths: {
    '/v1/keys': {
      post: {
        operationId: 'createKey',
        requestBody: {
          required: true,
          content: json({ type: 'object', properties: { name: { type: 'string' }, ...KEY_FIELDS }, required: ['name'], additionalProperties: false }),
        },
        responses: {
          '201': { description: 'The key, with its token (shown this once).', content: json(key({ token: { type: 'string' } }, ['token'])) },
          '409': error('A key with this externalId, or an active key with this name, exists; `id` names it.'),
          ...WRITE_ERRORS,
        },
      },
      get: {
        operationId: 'listKeys',
        parameters: [
          { name: 'limit', in: 'query', schema: { type: 'integer', minimum: 1, maximum: 1000, default: 50 } },
          { name: 'cursor', in: 'query', schema: { type: 'string' }, description: 'The `next` of the page before.' },
          { name: 'state', in: 'query', schema: STATE },
          { name: 'name', in: 'query', schema: { type: 'string' } },
          { name: 'externalId', in: 'query', schema: { type: 'string' } },
        ],
        responses: {
          '200': {
            description: 'A page of keys, in creation order.',
            content: json({
              type: 'object',
              properties: { keys: { type: 'array', items: key({ state: STATE }, ['state']) }, next: nullable({ type: 'string' }) },
              required: ['keys', 'next'],
              additionalProperties: false,
            }),
          },
          ...ERRORS,
        },
      },
    },
    '/v1/keys/{id}': {
      parameters: [keyId],
      get: {
        operationId: 'getKey',
        responses: {
          '200': { description: 'The key, where its quota and budgets stand, and its last use.', content: json(ref('KeyDetail')) },
          '404': error('No such key.'),
          ...ERRORS,
        },
      },
      patch: {
        operationId: 'updateKey',
        requestBody: { required: true, content: json({ type: 'object', properties: PATCH_FIELDS, additionalProperties: false, minProperties: 1 }) },
        responses: {
          '200': { description: 'The key as changed.', content: json(ref('KeyDetail')) },
          '404': error('No such key.'),
          '409': error('The key is revoked, or another key has this externalId.'),
          ...WRITE_ERRORS,
        },
      },
    },
    '/v1/keys/{id}/rotate': {
      parameters: [keyId],
      post: {
        operationId: 'rotateKey',
        requestBody: { content: json({ type: 'object', properties: { grace: { type: 'string' } }, additionalProperties: false }) },
        responses: {
          '200': {
            description: 'The new token (shown this once); the old one works until graceUntil.',
            content: json(key({ token: { type: 'string' }, graceUntil: nullable(instant) }, ['token', 'graceUntil'])),
          },
          '404': error('No such key.'),
          '409': error('The key is revoked.'),
          ...WRITE_ERRORS,
        },
      },
    },
    '/v1/keys/{id}/revoke': {
      parameters: [keyId],
      post: {
        operationId: 'revokeKey',
        responses: {
          '200': { description: 'The key, revoked (again: unchanged).', content: json(key({ revokedAt: instant }, ['revokedAt'])) },
          '404': error('No such key.'),
          ...WRITE_ERRORS,
        },
      },
    },
    '/v1/usage': {
      get: {
        operationId: 'usage',
        parameters: [
          { name: 'key', in: 'query', schema: { type: 'string' }, description: 'A key id, name or ext:<externalId>.' },
          { name: 'route', in: 'query', schema: { type: 'string' } },
          { name: 'since', in: 'query', schema: { type: 'string' }, description: '7d, or a day (2026-11-01); default 30 days back.' },
          { name: 'until', in: 'query', schema: { type: 'string' } },
          { name: 'by', in: 'query', schema: { type: 'string', enum: ['day', 'month', 'credential'] } },
        ],
        responses: {
          '200': {
            description: 'The rows of keyward usage --json; with Accept: text/csv, its CSV.',
            content: {
              ...(json({
                type: 'object',
                properties: {
                  rows: {
                    anyOf: [
                      { type: 'array', items: USAGE_ROW },
                      { type: 'array', items: CREDENTIAL_ROW },
                    ],
                  },
                },
                required: ['rows'],
                additionalProperties: false,
              }) as Record<string, unknown>),
              'text/csv': { schema: { type: 'string' } },
            },
          },
          ...ERRORS,
        },
      },
    },
    '/v1/audit': {
      get: {
        operationId: 'audit',
        parameters: [
          { name: 'since', in: 'query', schema: { type: 'string' } },
          { name: 'limit', in: 'query', schema: { type: 'integer', minimum: 1, maximum: 1000, default: 50 } },
          { name: 'cursor', in: 'query', schema: { type: 'string' }, description: 'The `next` of the page before: entries after this seq.' },
        ],
        responses: {
          '200': {
            description: 'Audit entries, oldest first; `whole` says whether the whole chain verifies.',
            content: json({
              type: 'object',
              properties: { entries: { type: 'array', items: ref('AuditEntry') }, next: nullable({ type: 'string' }), whole: { type: 'boolean' } },
              required: ['entries', 'next', 'whole'],
              additionalProperties: false,
            }),
          },
          ...ERRORS,
        },
      },
    },
    '/v1/openapi.json': {
      get: { operationId: 'openapi', responses: { '200': { description: 'This document.', content: json({ type: 'object' }) }, ...ERRORS } },
    },
  },
  components: {
    securitySchemes: { admin: { type: 'http', scheme: 'bearer', description: 'An admin token, kwa_…' } },
    schemas: {
      Error: {
        type: 'object',
        properties: {
          error: { type: 'string' },
          code: {
            type: 'string',
            enum: ['unauthorized', 'forbidden', 'not_found', 'bad_request', 'conflict', 'payload_too_large', 'unsupported_media_type', 'store_unavailable'],
          },
          field: { type: 'string' },
          id: { type: 'string' },
        },
        required: ['error', 'code'],
        additionalProperties: false,
      },
      Limits: {
        type: 'object',
        properties: {
          rate: { type: 'string' },
          burst: { type: 'integer' },
          concurrency: { type: 'integer' },
          quota: { type: 'string' },
          budgets: { type: 'object', additionalProperties: { type: 'string' } },
          alerts: { type: 'array', items: { type: 'integer' } },
          runCap: { type: 'number' },
          allowFrom: { type: 'array', items: { type: 'string' } },
        },
      },
      KeyDetail: key(
        {
          state: STATE,
          use: nullable({
            type: 'array',
            items: {
              type: 'object',
              properties: {
                kind: { type: 'string', enum: ['quota', 'budget'] },
                route: { type: 'string' },
                value: { type: 'number', description: 'Requests (a quota) or the amount in `unit` (a budget), per `period`.' },
                unit: { type: 'string', description: "`requests`, or the budget route's cost unit (`usd`, `characters`)." },
                used: { type: 'number' },
                remaining: { type: 'number' },
                period: { type: 'string', enum: ['day', 'month'] },
                resetsAt: instant,
              },
              required: ['kind', 'value', 'unit', 'used', 'remaining', 'period', 'resetsAt'],
              additionalProperties: false,
            },
          }),
        },
        ['state', 'use'],
      ),
      StatusCounts: {
        type: 'object',
        properties: {
          '2xx': { type: 'integer' },
          '3xx': { type: 'integer' },
          '4xx': { type: 'integer' },
          '5xx': { type: 'integer' },
          other: { type: 'integer' },
        },
        required: ['2xx', '3xx', '4xx', '5xx', 'other'],
        additionalProperties: false,
      },
      AuditEntry: {
        type: 'object',
        properties: {
          seq: { type: 'integer' },
          at: instant,
          actor: {
            oneOf: [
              {
                type: 'object',
                properties: { kind: { const: 'cli' }, user: { type: 'string' } },
                required: ['kind', 'user'],
                additionalProperties: false,
              },
              {
                type: 'object',
                properties: { kind: { const: 'admin' }, name: { type: 'string' }, address: { type: 'string' } },
                required: ['kind', 'name', 'address'],
                additionalProperties: false,
              },
            ],
          },
          action: { type: 'string', enum: ['key.create', 'key.update', 'key.rotate', 'key.revoke', 'key.import', 'admin.create', 'admin.revoke'] },
          target: {
            type: 'object',
            properties: { id: { type: 'string' }, name: { type: 'string' } },
            required: ['id', 'name'],
            additionalProperties: false,
          },
          changes: { type: 'object', additionalProperties: { type: 'array', minItems: 2, maxItems: 2 } },
          requestId: nullable({ type: 'string' }),
          hash: { type: 'string', pattern: '^[0-9a-f]{64}$' },
        },
        required: ['seq', 'at', 'actor', 'action', 'target', 'changes', 'requestId', 'hash'],
        additionalProperties: false,
      },
    },
  },
} as const;
