// Keys in one JSON file. Writers take an exclusive lock file, then write a
// temporary file, fsync it, rename it over the old one and fsync the folder,
// so readers see either the old set or the new one, never a torn file, and
// two `keyward keys` runs at once cannot lose each other's change.
// The gateway polls the file's identity (inode, size, mtime) four times a
// second: a rename always changes the inode, so a change is seen within
// 250 ms whatever the filesystem, where fs.watch would miss renames on some.
import { adminDrafts, cliActor, drafts, type AuditDraft, type AuditEntry } from './audit.ts';
import { adminProblem, type AdminRecord } from './admin-record.ts';
import { appendAudit, auditPath, readAudit } from './audit-sqlite.ts';
import { headOf, parseHead } from './audit-check.ts';
import type { AuditHead } from './audit.ts';
import { randomBytes } from 'node:crypto';
import { constants } from 'node:fs';
import { open, readdir, readFile, rename, stat, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import type { KeyRecord } from './keyset.ts';
import { jsonErrorWhere } from './json-position.ts';
import { isDate, readRecord } from './record.ts';
import type { Change, KeyStore, UpdateOptions } from './store.ts';

const FORMAT_VERSION = 1;
const POLL_MS = 250;
const LOCK_WAIT_MS = 10_000;
const LOCK_STALE_MS = 30_000;

/** Whether process `pid` is running (ours or another user's). */
function processAlive(pid: number): boolean {
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** The keys file cannot be used (exit 1); its message names the fault, never the contents. */
export class KeysFileError extends Error {
  override name = 'KeysFileError';
  readonly code = 'KEYWARD_ERR_KEYS_FILE';
}

/** The file exists but does not parse or check: never loaded, never written over without --force. */
export class KeysFileCorrupt extends KeysFileError {
  override name = 'KeysFileCorrupt';
}

/**
 * Parse and check a keys file; throws KeysFileCorrupt naming the first
 * problem. The file is written whole by keyward, so an entry whose identity
 * or state cannot be read means a damaged file: it is refused whole, the
 * last good set keeps serving and readiness says the file is not in force.
 * An entry whose rules this version cannot enforce is kept, marked
 * unsupported (record.ts), and refused alone.
 * The records returned are the parsed objects themselves (checked, not
 * copied), so a large file is held in memory once.
 */
export function parseKeysFile(text: string, costRoutes: readonly string[]): KeyRecord[] {
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    // JSON.parse's message quotes the text around the fault; the file's
    // contents stay out of logs, only where the fault is.
    throw new KeysFileCorrupt(`not valid JSON${jsonErrorWhere(text)}`);
  }
  // A later version's file (a higher "version") is read all the same: what it added that this version
  // must not ignore, a key says itself (`requires`, record.ts); everything else unknown is kept and ignored.
  const version = typeof doc === 'object' && doc !== null ? (doc as { version?: unknown }).version : undefined;
  if (!(Number.isInteger(version) && (version as number) >= FORMAT_VERSION)) {
    throw new KeysFileCorrupt(`expected an object with "version": ${FORMAT_VERSION} or later`);
  }
  const keys = (doc as { keys?: unknown }).keys;
  if (!Array.isArray(keys)) throw new KeysFileCorrupt('expected "keys" to be an array');
  const records: KeyRecord[] = [];
  for (let i = 0; i < keys.length; i++) {
    const k: unknown = keys[i];
    const read = readRecord(k, costRoutes);
    if (read.record === null) throw new KeysFileCorrupt(`keys[${i}]${read.problem}`);
    records.push(read.record);
  }
  return records;
}

/**
 * `head`: the audit log's last entry when this file was written, the
 * store's own record of where the log ends (audit-check.ts): a log whose
 * end was cut no longer reaches it. Older versions ignore the field.
 */
export function serialiseKeysFile(records: readonly KeyRecord[], head: AuditHead | null = null): string {
  // One key per line: diffs and `grep` stay readable, parsing stays one JSON.parse.
  const lines = records.map((r) => JSON.stringify(r));
  return `{"version":${FORMAT_VERSION},${headField(head)}"keys":[${lines.length > 0 ? `\n${lines.join(',\n')}\n` : ''}]}\n`;
}

const headField = (head: AuditHead | null): string => (head === null ? '' : `"auditHead":${JSON.stringify({ seq: head.seq, hash: head.hash })},`);

/** The `auditHead` a keys or admins file's text records, or null. */
function recordedHead(text: string): AuditHead | null {
  try {
    const h = (JSON.parse(text) as { auditHead?: { seq?: unknown; hash?: unknown } } | null)?.auditHead;
    return typeof h?.seq === 'number' && typeof h.hash === 'string' ? parseHead(`${h.seq}:${h.hash}`) : null;
  } catch {
    return null;
  }
}

/**
 * The text of `path` if it is a regular file. Opened without blocking and
 * checked with fstat before reading: a FIFO (or a device) put in the keys
 * file's place would otherwise hang the open in a thread-pool thread for
 * ever, freezing reloads and keeping the process from exiting.
 */
async function readRegularFile(path: string): Promise<string> {
  const fh = await open(path, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    if (!(await fh.stat()).isFile()) throw new KeysFileError(`${path} is not a regular file; replace it with a keys file`);
    return await fh.readFile('utf8');
  } finally {
    await fh.close();
  }
}

async function signature(path: string): Promise<string> {
  try {
    const s = await stat(path, { bigint: true });
    return `${s.ino}:${s.size}:${s.mtimeNs}`;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return 'missing';
    throw err;
  }
}

export class FileKeyStore implements KeyStore {
  readonly location: string;
  /** The routes a key's budget may name (routes.ts), for the record check. */
  readonly #costRoutes: readonly string[];

  constructor(path: string, costRoutes: readonly string[]) {
    this.location = path;
    this.#costRoutes = costRoutes;
  }

  get title(): string {
    return `keys file ${this.location}`;
  }

  /** Whether this process looked for temporary files a killed writer left (once, at its first read). */
  #swept = false;

  async load(): Promise<readonly KeyRecord[]> {
    if (!this.#swept) {
      this.#swept = true;
      await this.#sweepTemporary();
    }
    let text: string;
    try {
      text = await readRegularFile(this.location);
    } catch (err) {
      // No file yet is an empty store: the first `keys create` makes it. No
      // folder either is a typo or a missing install step, and says so.
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') {
        await this.#checkFolder();
        return [];
      }
      throw err;
    }
    return parseKeysFile(text, this.#costRoutes);
  }

  watch(onChange: (records: readonly KeyRecord[]) => void, onError: (err: Error) => void): () => void {
    let last: string | null = null;
    let busy = false;
    let stopped = false;
    const check = async (): Promise<void> => {
      const sig = await signature(this.location);
      if (sig === last) return;
      const first = last === null;
      last = sig;
      if (first) return; // the caller loaded the set it started with
      const records = await this.load();
      if (!stopped) onChange(records);
    };
    const tick = (): void => {
      if (busy) return;
      busy = true;
      check()
        .catch((err: Error) => {
          if (!stopped) onError(err);
        })
        .finally(() => {
          busy = false;
        });
    };
    tick();
    const timer = setInterval(tick, POLL_MS);
    timer.unref();
    return () => {
      stopped = true;
      clearInterval(timer);
    };
  }

  async update<T>(change: (records: readonly KeyRecord[]) => Change<T>, options: UpdateOptions = {}): Promise<T> {
    return this.#changing(options, async () => {
      let current: readonly KeyRecord[];
      try {
        current = await this.load();
      } catch (err) {
        if (!(err instanceof KeysFileCorrupt)) throw err;
        if (options.force !== true)
          throw new KeysFileCorrupt(`${err.message}; nothing was changed (--force replaces the file, keeping the unreadable one beside it)`);
        // --force: keep the unreadable file for inspection, start from an empty set.
        const aside = `${this.location}.corrupt-${new Date().toISOString().replace(/[:.]/g, '-')}`;
        await rename(this.location, aside);
        this.setAside = aside;
        current = [];
      }
      const next = change(current);
      const ids = new Set<string>();
      for (const r of next.records) {
        if (ids.has(r.id)) throw new KeysFileError(`key id ${r.id} appears twice; fix the file by hand before changing it`);
        ids.add(r.id);
      }
      const entries = drafts(
        current,
        next.records,
        { actor: options.actor ?? cliActor(), requestId: options.requestId ?? null, importing: options.importing === true },
        Date.now(),
      );
      return { entries, path: this.location, text: (head) => serialiseKeysFile(next.records, head), result: next.result };
    });
  }

  /**
   * One change under the keys file's lock: `work` reads what it changes and
   * says what to write; its audit entries are appended first, so a change
   * whose entry cannot be written is not made (docs/operations.md, "Audit log").
   */
  async #changing<T>(
    options: UpdateOptions,
    work: () => Promise<{ entries: AuditDraft[]; path: string; text: (head: AuditHead | null) => string; result: T }>,
  ): Promise<T> {
    await this.#checkFolder();
    const release = await this.#lock(`${this.location}.lock`);
    try {
      const { entries, path, text, result } = await work();
      let appended: AuditEntry[];
      try {
        appended = appendAudit(auditPath(this.location), entries);
      } catch (err) {
        throw new KeysFileError(`the audit log ${auditPath(this.location)} cannot be written (${(err as Error).message}); nothing was changed`);
      }
      // The file records where the log ends: its new last entry, or (no entry: nothing shown changed) what it recorded before.
      const head = headOf(appended) ?? (await this.#headIn(path));
      await this.#writeAtomically(path, text(head));
      return result;
    } finally {
      await release();
    }
  }

  /** The admin tokens' file, beside the keys file: small, read on every admin request (docs/admin-api.md). */
  get #adminsPath(): string {
    return `${this.location}.admins`;
  }

  async admins(): Promise<readonly AdminRecord[]> {
    let text: string;
    try {
      text = await readRegularFile(this.#adminsPath);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
      throw err;
    }
    let doc: unknown;
    try {
      doc = JSON.parse(text);
    } catch {
      throw new KeysFileCorrupt(`${this.#adminsPath} is not valid JSON${jsonErrorWhere(text)}`);
    }
    const admins = (doc as { admins?: unknown } | null)?.admins;
    if (!Array.isArray(admins)) throw new KeysFileCorrupt(`${this.#adminsPath}: expected "admins" to be an array`);
    admins.forEach((a, i) => {
      const problem = adminProblem(a);
      if (problem !== null) throw new KeysFileCorrupt(`${this.#adminsPath}: admins[${i}]${problem}`);
    });
    return admins as AdminRecord[];
  }

  async updateAdmins<T>(
    change: (admins: readonly AdminRecord[]) => { readonly admins: readonly AdminRecord[]; readonly result: T },
    options: UpdateOptions = {},
  ): Promise<T> {
    return this.#changing(options, async () => {
      const current = await this.admins();
      const next = change(current);
      const entries = adminDrafts(current, next.admins, { actor: options.actor ?? cliActor(), requestId: options.requestId ?? null }, Date.now());
      const lines = next.admins.map((a) => JSON.stringify(a));
      const text = (head: AuditHead | null): string =>
        `{"version":${FORMAT_VERSION},${headField(head)}"admins":[${lines.length > 0 ? `\n${lines.join(',\n')}\n` : ''}]}\n`;
      return { entries, path: this.#adminsPath, text, result: next.result };
    });
  }

  auditEntries(): Promise<AuditEntry[]> {
    return Promise.resolve(readAudit(auditPath(this.location)));
  }

  /** Where the keys file and the admins file each recorded the log's end at their last write. */
  async auditAnchors(): Promise<Array<{ head: AuditHead; from: string }>> {
    const out: Array<{ head: AuditHead; from: string }> = [];
    for (const path of [this.location, this.#adminsPath]) {
      const head = await this.#headIn(path);
      if (head !== null) out.push({ head, from: `the keys store (${basename(path)})` });
    }
    return out;
  }

  /** The latest head the store recorded (the gateway logs it at each change). */
  async auditHead(): Promise<AuditHead | null> {
    const heads = (await this.auditAnchors()).map((a) => a.head);
    return heads.reduce<AuditHead | null>((a, b) => (a === null || b.seq > a.seq ? b : a), null);
  }

  async #headIn(path: string): Promise<AuditHead | null> {
    try {
      return recordedHead(await readRegularFile(path));
    } catch {
      return null;
    }
  }

  /** Where --force moved an unreadable file, for the CLI to say. */
  setAside: string | null = null;

  // A keys file under a folder that does not exist is a typo or a missing
  // install step; creating folders silently would hide it.
  async #checkFolder(): Promise<void> {
    const dir = dirname(this.location);
    try {
      if (!(await stat(dir)).isDirectory()) throw new KeysFileError(`${dir} is not a folder`);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new KeysFileError(`the folder ${dir} does not exist; create it first`);
      throw err;
    }
  }

  get #usePath(): string {
    return `${this.location}.last-used`;
  }

  async lastUse(): Promise<ReadonlyMap<string, string>> {
    try {
      const doc = JSON.parse(await readRegularFile(this.#usePath)) as unknown;
      if (typeof doc !== 'object' || doc === null) return new Map();
      return new Map(Object.entries(doc as Record<string, unknown>).filter((e): e is [string, string] => isDate(e[1])));
    } catch {
      // Missing or unreadable: last use is informational, never a reason to fail.
      return new Map();
    }
  }

  // A separate small file: writing last-use times into keys.json would make
  // every gateway reload its whole key set on every batch.
  async recordUse(uses: ReadonlyMap<string, number>): Promise<void> {
    if (uses.size === 0) return;
    const release = await this.#lock(`${this.#usePath}.lock`);
    try {
      const merged: Record<string, string> = Object.fromEntries(await this.lastUse());
      for (const [id, ms] of uses) {
        const stored = merged[id];
        if (stored === undefined || Date.parse(stored) < ms) merged[id] = new Date(ms).toISOString();
      }
      await this.#writeAtomically(this.#usePath, `${JSON.stringify(merged)}\n`);
    } finally {
      await release();
    }
  }

  async #lock(lockPath: string): Promise<() => Promise<void>> {
    const deadline = Date.now() + LOCK_WAIT_MS;
    for (;;) {
      try {
        const fh = await open(lockPath, constants.O_CREAT | constants.O_EXCL | constants.O_WRONLY, 0o600);
        await fh.writeFile(String(process.pid));
        await fh.close();
        return () => unlink(lockPath).catch(() => undefined);
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      }
      if (await this.#staleLock(lockPath)) {
        await unlink(lockPath).catch(() => undefined);
        continue;
      }
      if (Date.now() > deadline) throw new KeysFileError(`${lockPath} is held by another process`);
      await sleep(20 + Math.random() * 30);
    }
  }

  // A lock whose writer died (kill -9, power loss) must not block key
  // management forever: it is stale when its process is gone or it is old.
  async #staleLock(lockPath: string): Promise<boolean> {
    try {
      const [text, s] = await Promise.all([readFile(lockPath, 'utf8'), stat(lockPath)]);
      if (Date.now() - s.mtimeMs > LOCK_STALE_MS) return true;
      const pid = Number(text);
      if (!Number.isInteger(pid) || pid <= 0) return Date.now() - s.mtimeMs > 1_000;
      try {
        process.kill(pid, 0);
        return false;
      } catch (err) {
        return (err as NodeJS.ErrnoException).code === 'ESRCH';
      }
    } catch {
      return false; // vanished between open and read: just retry
    }
  }

  /**
   * A writer killed between writing its temporary copy and renaming it
   * (`kill -9`, power loss) leaves `keys.json.<pid>.<hex>.tmp` behind: a
   * 0600 copy of every digest that nothing will ever read. Removed when its
   * writer is gone; a live writer's is its own.
   */
  async #sweepTemporary(): Promise<void> {
    const dir = dirname(this.location);
    const prefix = `${basename(this.location)}.`;
    let names: string[];
    try {
      names = await readdir(dir);
    } catch {
      return; // no folder yet: load says so
    }
    for (const name of names) {
      if (!name.startsWith(prefix)) continue;
      const m = /^(?:admins\.|last-used\.)?(\d{1,10})\.[0-9a-f]{8}\.tmp$/.exec(name.slice(prefix.length));
      if (m === null || processAlive(Number(m[1]))) continue;
      await unlink(join(dir, name)).catch(() => undefined);
    }
  }

  async #writeAtomically(path: string, text: string): Promise<void> {
    const tmp = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
    const fh = await open(tmp, 'wx', 0o600);
    try {
      await fh.writeFile(text);
      await fh.sync();
    } finally {
      await fh.close();
    }
    try {
      await rename(tmp, path);
    } catch (err) {
      await unlink(tmp).catch(() => undefined);
      throw err;
    }
    // The rename itself is durable only once the folder is synced.
    const dir = await open(dirname(path), 'r');
    try {
      await dir.sync();
    } finally {
      await dir.close();
    }
  }
}
