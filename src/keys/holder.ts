// The key set the request path reads, kept current from a store
// (docs/keys.md, docs/fleet.md): the first load, every change the store's
// watch reports, and the store's health. The policy lives here and nowhere
// else: a keys file that cannot be read keeps the last good set; a shared
// store that is down keeps it too, up to KEYWARD_KEYS_MAX_STALENESS, and
// one that never delivered a set leaves the gateway with none.
import type { Logger } from '../observe/log.ts';
import type { Metrics } from '../observe/metrics.ts';
import { awaitsNewer, KeySet, unsupportedOf, type KeyRecord } from './keyset.ts';
import type { KeyStore } from './store.ts';
import { asError } from '../lib/error.ts';

export class KeyHolder {
  readonly #store: KeyStore;
  readonly #logger: Logger;
  readonly #metrics: Metrics;
  /** The staleness limit in force (it changes on reload), ms; 0 for none. */
  readonly #maxStalenessMs: () => number;
  #keys: KeySet | null = null;
  #up = true;
  #downSince = 0;
  #invalid: ReadonlyMap<string, string> = new Map();
  /** Why the keys file's last change could not be read (its last good set serves meanwhile); null when it could. */
  #problem: string | null = null;
  #stopWatch: (() => void) | null = null;
  /** How long the first load took, ms. */
  loadMs = 0;

  constructor(store: KeyStore, logger: Logger, metrics: Metrics, maxStalenessMs: () => number) {
    this.#store = store;
    this.#logger = logger;
    this.#metrics = metrics;
    this.#maxStalenessMs = maxStalenessMs;
    metrics.watchKeystore({ keys: () => this.#keys?.states(Date.now()) ?? null, up: () => this.up, invalid: () => this.#invalid.size });
  }

  /** Load the set, then follow the store's changes. A keys file that cannot be read fails the start. */
  async start(): Promise<void> {
    const started = performance.now();
    try {
      this.#keys = new KeySet(await this.#store.load());
      this.#metrics.keysLoaded(Date.now());
      this.#noteUnsupported(this.#keys, 0);
      this.#logHead();
    } catch (err) {
      // A shared store may be down while a gateway starts: it answers 503
      // keystore_unavailable until the watch delivers a set.
      if (this.#store.shared !== true) throw err;
      this.#down(asError(err));
      this.#logger.error({ err, keyStore: this.#store.location }, 'key store unreachable; no key set yet');
    }
    this.loadMs = Math.round(performance.now() - started);
    this.#stopWatch = this.#store.watch(
      (records) => this.#apply(records),
      (err) => (this.#store.shared === true ? this.#metrics.keysReloadFailed() : this.#failed(err)),
      (up, err) => this.#status(up, err),
      (invalid) => this.#invalidRows(invalid),
      (message, fields) => this.#logger.warn({ keyStore: this.#store.location, ...fields }, message),
    );
  }

  /** The set to serve: none before one was loaded, or while a shared store has been down longer than allowed. */
  current(): KeySet | null {
    if (this.#up || this.#keys === null) return this.#keys;
    const max = this.#maxStalenessMs();
    return max > 0 && Date.now() - this.#downSince > max ? null : this.#keys;
  }

  /** The last set loaded, stale or not. */
  get loaded(): KeySet | null {
    return this.#keys;
  }

  /** The store is reachable and its last change is in force. */
  get up(): boolean {
    return this.#up && this.#problem === null;
  }

  /** Why the store's last change is not in force (a keys file that stopped parsing), or null. */
  get problem(): string | null {
    return this.#problem;
  }

  /** Re-read the whole store now (SIGHUP); keeps the current set if it cannot be read. */
  async reload(): Promise<void> {
    try {
      this.#apply(await this.#store.load());
    } catch (err) {
      this.#failed(asError(err));
    }
  }

  stop(): void {
    this.#stopWatch?.();
  }

  #apply(records: readonly KeyRecord[]): void {
    const before = this.#keys?.unsupported ?? 0;
    this.#keys = this.#keys === null ? new KeySet(records) : this.#keys.next(records);
    this.#noteUnsupported(this.#keys, before);
    this.#up = true;
    this.#problem = null;
    this.#metrics.keysLoaded(Date.now());
    this.#logger.info({ keys: this.#keys.size }, 'keys reloaded');
    this.#logHead();
  }

  /** The audit log's head last logged: said again only when it moved. */
  #head: string | null = null;

  /**
   * The audit log's head, logged when it moves (docs/security.md, "What the
   * audit log proves"): the journal keeps it where cutting the log cannot
   * reach, and `keyward audit verify --head SEQ:HASH` holds the log to it.
   */
  #logHead(): void {
    this.#store.auditHead().then(
      (head) => {
        const said = head === null ? null : `${head.seq}:${head.hash}`;
        if (said === null || said === this.#head) return;
        this.#head = said;
        this.#logger.info({ auditSeq: head?.seq, auditHead: said }, 'audit log head');
      },
      (err: unknown) => this.#logger.warn({ err, keyStore: this.#store.location }, 'audit log head not read'),
    );
  }

  /** Keys written by a newer keyward with rules this one cannot enforce: said when their number changes (docs/keys.md, "Versions"). */
  #noteUnsupported(set: KeySet, before: number): void {
    if (set.unsupported === before || set.unsupported === 0) return;
    const now = Date.now();
    const some = set.records.filter((r) => awaitsNewer(r, now)).slice(0, 10);
    this.#logger.warn(
      { keyStore: this.#store.location, keys: set.unsupported, ids: some.map((r) => r.id), problems: some.map((r) => unsupportedOf(r)) },
      'keys with rules this version cannot enforce are refused (503 key_unsupported) until a newer keyward serves them',
    );
  }

  #failed(err: Error): void {
    // The last good set stays in force; readiness and keyward_keystore_up say the file is not.
    this.#problem = `${this.#store.shared === true ? 'key store' : 'keys file'} ${this.#store.location} cannot be read (${err.message}); serving the last good key set`;
    this.#metrics.keysReloadFailed();
    this.#logger.error({ err, keyStore: this.#store.location }, 'keys not reloaded; keeping the previous set');
  }

  #down(err: Error | undefined): void {
    this.#up = false;
    this.#downSince = Date.now();
    if (this.#keys !== null) this.#logger.warn({ keyStore: this.#store.location, err: err ?? null }, 'key store unreachable; serving the last good key set');
  }

  // Said once per transition, not once per request or per failed check.
  #status(up: boolean, err?: Error): void {
    if (!up) return this.#down(err);
    this.#up = true;
    this.#logger.info({ keyStore: this.#store.location }, 'key store reachable again');
  }

  // Each skipped row is logged once, when it first fails the check (by id, never its digest).
  #invalidRows(invalid: ReadonlyMap<string, string>): void {
    for (const [id, problem] of invalid) {
      if (!this.#invalid.has(id))
        this.#logger.warn({ keyStore: this.#store.location, id, problem }, 'stored key skipped: it fails the record check and opens nothing');
    }
    this.#invalid = invalid;
  }
}
