// The admin API (docs/admin-api.md): keys created, listed, read, changed,
// rotated and revoked over HTTP on the admin listener, usage rows and the
// audit log, for operators' scripts and keys-as-code tools. It runs the
// checks the CLI runs (keys/changes.ts, views/usage-report.ts) and the
// store's own operations (keys/manage.ts): one implementation of each
// change, whichever side asks. Served by the gateway's admin listener, so
// it has a room of its own rather than the CLI's.
// Every answer conforms to the OpenAPI document (openapi.ts); the tests hold
// each one to it.
import { randomUUID } from 'node:crypto';
import type http from 'node:http';
import type { AdminRecord } from '../keys/admin-record.ts';
import { adminFor } from '../keys/admins.ts';
import { auditOf } from '../keys/audit-check.ts';
import { unsupportedOf, type KeyRecord } from '../keys/keyset.ts';
import { createKey, findKey, KeyConflict, revokeKey, rotateKey, updateKey } from '../keys/manage.ts';
import type { KeyStore, UpdateOptions } from '../keys/store.ts';
import type { Logger } from '../observe/log.ts';
import type { UpstreamSpec } from '../request/routes.ts';
import { asError } from '../lib/error.ts';
import { durationOption, keyChangesOf, newKeyOptions, type KeyRules } from '../keys/changes.ts';
import { keyRules } from '../request/routes.ts';
import { OPENAPI } from './openapi.ts';

/** The shared checks carry a command's help for the CLI to print; an API answer is the message alone. */
const NO_HELP = '';
import { usageQuery, writeUsage } from '../views/usage-report.ts';

/** The largest request body taken, bytes (docs/admin-api.md, "Safety"). */
export const BODY_MAX = 64 * 1024;
const PAGE_DEFAULT = 50;
const PAGE_MAX = 1_000;

export interface AdminApiOptions {
  readonly store: KeyStore;
  /** Where the usage ledger is found beside the keys file (ledger/open.ts). */
  readonly keysFile: string;
  readonly providers: readonly UpstreamSpec[];
  readonly logger: Logger;
  /** What `GET /keyward/key` answers for a key, from the serving process's figures: the key view's `use` is its quota and budgets. */
  readonly keyStatus: (record: KeyRecord) => Promise<unknown>;
}

export interface AdminApi {
  /** Answer a request whose path starts with `/v1/`. */
  handle(req: http.IncomingMessage, res: http.ServerResponse): void;
  /** The active admin the request's bearer token belongs to, or null (no token, a client key, unknown, revoked). */
  admin(req: http.IncomingMessage): Promise<AdminRecord | null>;
}

/** An answer refused: its status, code and message, and the field it names. */
class Refusal extends Error {
  readonly status: number;
  readonly code: string;
  readonly field: string | undefined;
  readonly extra: Record<string, unknown>;
  constructor(status: number, code: string, message: string, field?: string, extra: Record<string, unknown> = {}) {
    super(message);
    this.status = status;
    this.code = code;
    this.field = field;
    this.extra = extra;
  }
}

const notFound = (what = 'Not found.'): Refusal => new Refusal(404, 'not_found', what);
const bad = (message: string, field?: string): Refusal => new Refusal(400, 'bad_request', message, field);

/** A request's JSON body fields, as the CLI's flags name them. */
const FLAGS: Readonly<Record<string, string>> = {
  name: 'name',
  routes: 'routes',
  expiresIn: 'expires-in',
  rate: 'rate',
  burst: 'burst',
  concurrency: 'concurrency',
  quota: 'quota',
  budgets: 'budget',
  alertAt: 'alert-at',
  runCap: 'run-cap',
  allowFrom: 'allow-from',
  externalId: 'external-id',
};
const FIELD_OF_FLAG = new Map(Object.entries(FLAGS).map(([field, flag]) => [flag, field]));

/** A check's message as the API says it: `--rate must be …` becomes `rate must be …`, and the first field named is the answer's `field`. */
function fromCli(err: unknown): Refusal {
  if (err instanceof KeyConflict) return new Refusal(409, 'conflict', err.message, undefined, { id: err.existing });
  const e = asError(err) as Error & { code?: string };
  if (e.code !== 'KEYWARD_ERR_USAGE' && e.code !== 'KEYWARD_ERR_KEY_USAGE') throw err;
  let field: string | undefined;
  const message = e.message.replace(/--([a-z-]+)/g, (_m, flag: string) => {
    const name = FIELD_OF_FLAG.get(flag) ?? flag;
    field ??= name;
    return name;
  });
  if (/^no key with id or name /.test(message)) return notFound('No such key.');
  // Changing a revoked key: the request is fine, the key's state refuses it.
  if (/ is revoked/.test(message)) return new Refusal(409, 'conflict', message, field);
  return bad(message, field);
}

type Kind = 'string' | 'integer' | 'number' | 'strings' | 'integers' | 'budgets';
const CREATE_KINDS: Readonly<Record<string, Kind>> = {
  name: 'string',
  routes: 'strings',
  expiresIn: 'string',
  rate: 'string',
  burst: 'integer',
  concurrency: 'integer',
  quota: 'string',
  budgets: 'budgets',
  alertAt: 'integers',
  runCap: 'number',
  allowFrom: 'strings',
  externalId: 'string',
};
/** PATCH takes the fields of create but the name (a key keeps its name; revoke and create to rename). */
const UPDATE_KINDS: Readonly<Record<string, Kind>> = Object.fromEntries(Object.entries(CREATE_KINDS).filter(([field]) => field !== 'name'));

/**
 * A JSON body as the CLI's parsed flags (`{rate: "10/s", budget: ["seo=5/day"]}`),
 * each field's JSON type checked and unknown fields refused by name; null
 * (on PATCH) is the CLI's `none` (`all` for routes, `never` for expiresIn).
 */
function asFlags(body: unknown, kinds: Readonly<Record<string, Kind>>, nullable: boolean): Record<string, unknown> {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw bad('The body must be a JSON object.');
  const values: Record<string, unknown> = {};
  for (const [field, v] of Object.entries(body)) {
    // Own fields only: `constructor` or `__proto__` in a body are unknown fields, not the prototype's.
    const kind = Object.hasOwn(kinds, field) ? kinds[field] : undefined;
    if (kind === undefined) throw bad(`Unknown field ${field}.`, field);
    const flag = FLAGS[field] as string;
    if (v === null) {
      if (!nullable || field === 'name') throw bad(`${field} may not be null here.`, field);
      // null removes a setting: a limit, the scope (every route), the expiry; alertAt goes back to the default thresholds.
      values[flag] = field === 'routes' ? 'all' : field === 'expiresIn' ? 'never' : field === 'budgets' ? undefined : field === 'alertAt' ? 'default' : 'none';
      continue;
    }
    const wrong = (what: string): Refusal => bad(`${field} must be ${what}.`, field);
    switch (kind) {
      case 'string':
        if (typeof v !== 'string') throw wrong('a string');
        values[flag] = v;
        break;
      case 'integer':
        if (!Number.isSafeInteger(v)) throw wrong('a whole number');
        values[flag] = String(v);
        break;
      case 'number':
        if (typeof v !== 'number' || !Number.isFinite(v)) throw wrong('a number');
        values[flag] = String(v);
        break;
      case 'strings':
        if (!Array.isArray(v) || v.length === 0 || !v.every((s) => typeof s === 'string' && s !== '' && !s.includes(','))) throw wrong('a list of strings');
        values[flag] = v.join(',');
        break;
      case 'integers':
        if (!Array.isArray(v) || !v.every((n) => Number.isSafeInteger(n))) throw wrong('a list of whole numbers');
        values[flag] = v.length === 0 ? 'none' : v.join(',');
        break;
      case 'budgets': {
        if (typeof v !== 'object' || Array.isArray(v)) throw wrong('an object of route: "AMOUNT/day" or null');
        // `{}` names no budget: a change of nothing, refused as an empty body is.
        if (Object.keys(v as object).length === 0) throw wrong('an object naming at least one route (null removes them all)');
        const list: string[] = [];
        for (const [route, amount] of Object.entries(v as Record<string, unknown>)) {
          if (amount !== null && typeof amount !== 'string') throw wrong('an object of route: "AMOUNT/day" or null');
          if (amount === null && !nullable) throw bad(`budgets.${route} may not be null here.`, field);
          list.push(`${route}=${amount ?? 'none'}`);
        }
        values[flag] = list;
        break;
      }
    }
  }
  return values;
}

/** A key as the API shows it: never its digest, nor those of rotated-out tokens. */
function keyView(r: KeyRecord, lastUsed: string | null): Record<string, unknown> {
  return {
    id: r.id,
    name: r.name,
    externalId: r.externalId ?? null,
    routes: r.routes ?? null,
    created: r.created,
    expires: r.expires,
    revoked: r.revoked,
    lastUsed,
    limits: r.limits ?? null,
    ...(unsupportedOf(r) === null ? {} : { unsupported: unsupportedOf(r) }),
  };
}

/** The body, at most BODY_MAX bytes, parsed; a Refusal when it is larger or not JSON. */
function readBody(req: http.IncomingMessage): Promise<unknown> {
  return new Promise((resolve, reject) => {
    const declared = Number(req.headers['content-length'] ?? 0);
    // A body refused is read and dropped, not left unread: a socket closed with bytes still
    // arriving is reset, and the client may lose the 413 to the reset (the listener's
    // requestTimeout bounds how long it reads).
    if (declared > BODY_MAX) {
      req.resume();
      return reject(new Refusal(413, 'payload_too_large', `The body is larger than ${BODY_MAX / 1024} KiB.`));
    }
    const chunks: Buffer[] = [];
    let size = 0;
    req.on('data', (c: Buffer) => {
      size += c.length;
      if (size > BODY_MAX) {
        req.removeAllListeners('data');
        req.resume();
        reject(new Refusal(413, 'payload_too_large', `The body is larger than ${BODY_MAX / 1024} KiB.`));
      } else chunks.push(c);
    });
    req.on('error', reject);
    req.on('end', () => {
      const text = Buffer.concat(chunks).toString('utf8');
      if (text.trim() === '') return resolve({});
      // A body declared as something else (`text/plain`, a form) is not read as JSON behind its sender's back.
      const type = req.headers['content-type'];
      if (type !== undefined && !/^\s*application\/(?:[\w.+-]+\+)?json\s*(?:;|$)/i.test(type))
        return reject(new Refusal(415, 'unsupported_media_type', 'The body must be JSON (Content-Type: application/json).'));
      try {
        resolve(JSON.parse(text));
      } catch {
        reject(bad('The body is not valid JSON.'));
      }
    });
  });
}

/** A page size from `?limit=`. */
function pageSize(text: string | null): number {
  if (text === null) return PAGE_DEFAULT;
  if (!/^[1-9]\d{0,3}$/.test(text) || Number(text) > PAGE_MAX) throw bad(`limit must be a whole number from 1 to ${PAGE_MAX}.`, 'limit');
  return Number(text);
}

/**
 * Only the query parameters an endpoint knows, each at most once: a write
 * that ignored `?dryRun=true` would do what the caller asked it not to, and
 * `?limit=1&limit=2` has no one meaning (docs/admin-api.md, "Errors").
 */
function onlyParams(params: URLSearchParams, known: readonly string[]): void {
  const seen = new Set<string>();
  for (const k of params.keys()) {
    if (!known.includes(k)) throw bad(`Unknown query parameter ${k}.`, k);
    if (seen.has(k)) throw bad(`Query parameter ${k} is given more than once.`, k);
    seen.add(k);
  }
}

/** What every endpoint works with. */
interface Context extends AdminApiOptions {
  readonly rules: KeyRules;
}

/** One request, authenticated and routed. */
interface Call {
  readonly req: http.IncomingMessage;
  readonly params: URLSearchParams;
  /** The `{id}` of the path, as sent (percent-encoded). */
  readonly id: string;
  readonly update: UpdateOptions;
}

type Answer = { status: number; body: unknown } | { status: number; csv: string };

function stateOf(r: KeyRecord, now: number): 'active' | 'revoked' | 'expired' {
  if (r.revoked !== null) return 'revoked';
  return r.expires !== null && Date.parse(r.expires) <= now ? 'expired' : 'active';
}

/** The key a path names: by id or `ext:<externalId>` only (a name is reused once its key is revoked, so it is no address here). */
async function theKey(ctx: Context, segment: string): Promise<KeyRecord> {
  let id: string;
  try {
    id = decodeURIComponent(segment);
  } catch {
    throw notFound('No such key.');
  }
  const all = await ctx.store.load();
  const found = id.startsWith('ext:') ? findKey(all, id) : (all.find((r) => r.id === id) ?? null);
  if (found === null) throw notFound('No such key.');
  return found;
}

const lastUsed = async (ctx: Context, id: string): Promise<string | null> => (await ctx.store.lastUse()).get(id) ?? null;

/**
 * A key with its state and where its quota and budgets stand this period:
 * the entries of `GET /keyward/key`'s `limits`, the same shape and the
 * figures the serving process holds (its limiter's, its primary's with
 * workers, its leases' in a fleet); null when they could not be had.
 */
async function detail(ctx: Context, r: KeyRecord): Promise<Record<string, unknown>> {
  const now = Date.now();
  let use: unknown = null;
  if (unsupportedOf(r) === null) {
    const limits = ((await ctx.keyStatus(r)) as { limits: ReadonlyArray<{ kind: string }> | null }).limits;
    use = limits === null ? null : limits.filter((l) => l.kind === 'quota' || l.kind === 'budget');
  }
  return { ...keyView(r, await lastUsed(ctx, r.id)), state: stateOf(r, now), use };
}

/** A JSON object body, or a 400. */
async function objectBody(req: http.IncomingMessage): Promise<Record<string, unknown>> {
  const body = await readBody(req);
  if (typeof body !== 'object' || body === null || Array.isArray(body)) throw bad('The body must be a JSON object.');
  return body as Record<string, unknown>;
}

async function createOne(ctx: Context, { req, update }: Call): Promise<Answer> {
  const values = asFlags(await readBody(req), CREATE_KINDS, false);
  if (typeof values.name !== 'string') throw bad('name is required.', 'name');
  try {
    const { name, options } = newKeyOptions(values, ctx.rules, NO_HELP);
    const { record, token } = await createKey(ctx.store, name, options, Date.now(), update);
    return { status: 201, body: { ...keyView(record, null), token } };
  } catch (err) {
    throw fromCli(err);
  }
}

async function listPage(ctx: Context, { params }: Call): Promise<Answer> {
  const limit = pageSize(params.get('limit'));
  const state = params.get('state');
  if (state !== null && !['active', 'revoked', 'expired'].includes(state)) throw bad('state must be active, revoked or expired.', 'state');
  const all = await ctx.store.load();
  const now = Date.now();
  let start = 0;
  const cursor = params.get('cursor');
  if (cursor !== null) {
    const at = all.findIndex((r) => r.id === cursor);
    if (at < 0) throw bad('cursor is no key of this list; start again without it.', 'cursor');
    start = at + 1;
  }
  const name = params.get('name');
  const externalId = params.get('externalId');
  const page: KeyRecord[] = [];
  let next: string | null = null;
  // Stable order: the store's (creation order); the cursor is the last key's id, so a key created meanwhile never shifts a page.
  for (let i = start; i < all.length; i++) {
    const r = all[i] as KeyRecord;
    if ((state !== null && stateOf(r, now) !== state) || (name !== null && r.name !== name) || (externalId !== null && r.externalId !== externalId)) continue;
    if (page.length === limit) {
      next = (page.at(-1) as KeyRecord).id;
      break;
    }
    page.push(r);
  }
  const used = await ctx.store.lastUse();
  return { status: 200, body: { keys: page.map((r) => ({ ...keyView(r, used.get(r.id) ?? null), state: stateOf(r, now) })), next } };
}

async function readOne(ctx: Context, { id }: Call): Promise<Answer> {
  return { status: 200, body: await detail(ctx, await theKey(ctx, id)) };
}

async function change(ctx: Context, { req, id, update }: Call): Promise<Answer> {
  const values = asFlags(await readBody(req), UPDATE_KINDS, true);
  const target = await theKey(ctx, id);
  try {
    await updateKey(ctx.store, target.id, keyChangesOf(values, ctx.rules, NO_HELP), Date.now(), update);
  } catch (err) {
    const refusal = fromCli(err);
    // The CLI's "needs --routes …" is an empty body here.
    if (refusal.code === 'bad_request' && /^keys update needs/.test(refusal.message)) throw bad('The body changes nothing; give at least one field.');
    throw refusal;
  }
  return { status: 200, body: await detail(ctx, await theKey(ctx, target.id)) };
}

async function rotate(ctx: Context, { req, id, update }: Call): Promise<Answer> {
  const body = await objectBody(req);
  const unknown = Object.keys(body).find((k) => k !== 'grace');
  if (unknown !== undefined) throw bad(`Unknown field ${unknown}.`, unknown);
  if (body.grace !== undefined && typeof body.grace !== 'string') throw bad('grace must be a duration such as 10m or 1d.', 'grace');
  const target = await theKey(ctx, id);
  try {
    const graceMs = body.grace === undefined ? 0 : durationOption('grace', body.grace, '', true);
    const { record, token, graceUntil } = await rotateKey(ctx.store, target.id, graceMs, Date.now(), update);
    return { status: 200, body: { ...keyView(record, await lastUsed(ctx, record.id)), token, graceUntil } };
  } catch (err) {
    throw fromCli(err);
  }
}

async function revoke(ctx: Context, { req, id, update }: Call): Promise<Answer> {
  const unknown = Object.keys(await objectBody(req))[0];
  if (unknown !== undefined) throw bad(`Unknown field ${unknown}.`, unknown);
  const target = await theKey(ctx, id);
  const { record } = await revokeKey(ctx.store, target.id, Date.now(), update);
  return { status: 200, body: { ...keyView(record, await lastUsed(ctx, record.id)), revokedAt: record.revoked } };
}

/** `keyward usage --json` (or `--csv` for `Accept: text/csv`), written where the API can read it. */
async function usage(ctx: Context, { req, params }: Call): Promise<Answer> {
  const csv = /\btext\/csv\b/.test(req.headers.accept ?? '');
  const values: Record<string, unknown> = { ...Object.fromEntries(params), [csv ? 'csv' : 'json']: true };
  let out = '';
  const stdout = { write: (s: string): boolean => ((out += s), true) };
  const stderr = { write: (): boolean => true };
  try {
    await writeUsage(usageQuery(values, ctx.providers, NO_HELP), ctx.store, ctx.keysFile, ctx.providers, NO_HELP, {
      stdout: stdout as unknown as NodeJS.WriteStream,
      stderr: stderr as unknown as NodeJS.WriteStream,
    });
  } catch (err) {
    throw fromCli(err);
  }
  return csv ? { status: 200, csv: out } : { status: 200, body: { rows: JSON.parse(out) as unknown } };
}

async function auditPage(ctx: Context, { params }: Call): Promise<Answer> {
  const limit = pageSize(params.get('limit'));
  const cursor = params.get('cursor');
  if (cursor !== null && !/^\d{1,15}$/.test(cursor)) throw bad('cursor must be the seq of an entry.', 'cursor');
  const since = params.get('since');
  let day: string | null = null;
  try {
    if (since !== null) day = usageQuery({ since }, ctx.providers, NO_HELP).since;
  } catch (err) {
    throw fromCli(err);
  }
  const entries = await ctx.store.auditEntries();
  const after = cursor === null ? 0 : Number(cursor);
  const shown = entries.filter((e) => e.seq > after && (day === null || e.at.slice(0, 10) >= day));
  const page = shown.slice(0, limit);
  return {
    status: 200,
    body: {
      entries: page,
      next: shown.length > limit ? String((page.at(-1) as { seq: number }).seq) : null,
      whole: (await auditOf(ctx.store, entries)) === null,
    },
  };
}

const document = (): Promise<Answer> => Promise.resolve({ status: 200, body: OPENAPI });

/** The route table: method, path, whether it changes anything (role write), the query parameters it knows, and the endpoint. */
const ENDPOINTS: ReadonlyArray<{
  method: string;
  path: RegExp;
  write: boolean;
  params: readonly string[];
  run: (ctx: Context, call: Call) => Promise<Answer>;
}> = [
  { method: 'GET', path: /^\/v1\/openapi\.json$/, write: false, params: [], run: document },
  { method: 'POST', path: /^\/v1\/keys$/, write: true, params: [], run: createOne },
  { method: 'GET', path: /^\/v1\/keys$/, write: false, params: ['limit', 'cursor', 'state', 'name', 'externalId'], run: listPage },
  { method: 'GET', path: /^\/v1\/keys\/([^/]+)$/, write: false, params: [], run: readOne },
  { method: 'PATCH', path: /^\/v1\/keys\/([^/]+)$/, write: true, params: [], run: change },
  { method: 'POST', path: /^\/v1\/keys\/([^/]+)\/rotate$/, write: true, params: [], run: rotate },
  { method: 'POST', path: /^\/v1\/keys\/([^/]+)\/revoke$/, write: true, params: [], run: revoke },
  { method: 'GET', path: /^\/v1\/usage$/, write: false, params: ['key', 'route', 'since', 'until', 'by'], run: usage },
  { method: 'GET', path: /^\/v1\/audit$/, write: false, params: ['since', 'limit', 'cursor'], run: auditPage },
];

function send(res: http.ServerResponse, answer: Answer, requestId: string): void {
  const csv = 'csv' in answer;
  const text = csv ? answer.csv : JSON.stringify(answer.body);
  res.writeHead(answer.status, {
    'content-type': csv ? 'text/csv; charset=utf-8' : 'application/json',
    'content-length': Buffer.byteLength(text),
    'cache-control': 'no-store',
    'x-request-id': requestId,
  });
  res.end(text);
}

function refuse(res: http.ServerResponse, r: Refusal, requestId: string): void {
  if (r.status === 401) res.setHeader('www-authenticate', 'Bearer realm="keyward admin"');
  send(res, { status: r.status, body: { error: r.message, code: r.code, ...(r.field === undefined ? {} : { field: r.field }), ...r.extra } }, requestId);
}

/** The active admin whose bearer token `req` carries, or null (none, a client key, unknown, revoked). */
async function adminOf(store: KeyStore, req: http.IncomingMessage): Promise<AdminRecord | null> {
  const auth = req.headers.authorization;
  if (typeof auth !== 'string' || !/^bearer /i.test(auth)) return null;
  return adminFor(await store.admins(), auth.slice(7).trim());
}

/** Authenticate, route, check the role, run: the answer or the refusal. `said` learns who asked, for the log line. */
async function answer(ctx: Context, req: http.IncomingMessage, url: URL, requestId: string, said: (a: AdminRecord) => void): Promise<Answer> {
  let who: AdminRecord | null;
  try {
    who = await adminOf(ctx.store, req);
  } catch (err) {
    ctx.logger.error({ err }, 'admin tokens not read');
    throw new Refusal(503, 'store_unavailable', 'The key store could not be read; try again.');
  }
  if (who === null) throw new Refusal(401, 'unauthorized', 'An admin token is required (Authorization: Bearer kwa_…).');
  said(who);
  const method = req.method === 'HEAD' ? 'GET' : (req.method ?? 'GET');
  let match: RegExpExecArray | null = null;
  const endpoint = ENDPOINTS.find((e) => e.method === method && (match = e.path.exec(url.pathname)) !== null);
  if (endpoint === undefined) throw notFound();
  if (endpoint.write && who.role !== 'write') throw new Refusal(403, 'forbidden', 'This admin token may only read (role read).');
  // Before the endpoint runs: nothing is read or changed for a request it would misread.
  onlyParams(url.searchParams, endpoint.params);
  const call: Call = {
    req,
    params: url.searchParams,
    id: (match as RegExpExecArray | null)?.[1] ?? '',
    update: { actor: { kind: 'admin', name: who.name, address: req.socket.remoteAddress ?? 'unknown' }, requestId },
  };
  try {
    return await endpoint.run(ctx, call);
  } catch (err) {
    if (err instanceof Refusal) throw err;
    const e = asError(err) as Error & { code?: string };
    if (e.code === 'KEYWARD_ERR_KEY_USAGE' || e.code === 'KEYWARD_ERR_USAGE') throw fromCli(err);
    ctx.logger.error({ err }, 'admin request failed');
    throw new Refusal(503, 'store_unavailable', 'The key store or its audit log could not be read or written; nothing was changed.');
  }
}

export function adminApi(options: AdminApiOptions): AdminApi {
  const ctx: Context = { ...options, rules: keyRules(options.providers) };
  const handle = (req: http.IncomingMessage, res: http.ServerResponse): void => {
    const started = Date.now();
    const requestId = randomUUID();
    const url = new URL(req.url ?? '/', 'http://admin');
    let who: AdminRecord | null = null;
    res.on('finish', () =>
      // One line per /v1/ request: the admin's name, never its token.
      ctx.logger.info(
        {
          admin: who?.name ?? null,
          method: req.method,
          path: url.pathname,
          status: res.statusCode,
          requestId,
          ms: Date.now() - started,
          address: req.socket.remoteAddress,
        },
        'admin request',
      ),
    );
    answer(ctx, req, url, requestId, (a) => (who = a)).then(
      (a) => send(res, a, requestId),
      (err: unknown) => refuse(res, err instanceof Refusal ? err : new Refusal(503, 'store_unavailable', 'The request could not be answered.'), requestId),
    );
  };
  return { handle, admin: (req) => adminOf(ctx.store, req) };
}
