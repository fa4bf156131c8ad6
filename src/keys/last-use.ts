// When each key was last used (docs/keys.md, `keys list`): noted in memory on
// every authenticated request (a Map write) and handed to the store in
// batches, so the request path never waits on a disk or a database.
import type { KeyStore } from './store.ts';
import { detach } from '../lib/detach.ts';
import { asError } from '../lib/error.ts';

export class LastUse {
  readonly #pending = new Map<string, number>();
  readonly #store: KeyStore;
  #timer: NodeJS.Timeout | null = null;
  #writing: Promise<void> = Promise.resolve();
  readonly #onError: (err: Error) => void;
  /** Told how long the store's write held the event loop, in seconds. */
  readonly #timed: (seconds: number) => void;

  constructor(store: KeyStore, intervalMs: number, onError: (err: Error) => void, timed: (seconds: number) => void = () => undefined) {
    this.#store = store;
    this.#onError = onError;
    this.#timed = timed;
    this.#timer = setInterval(() => detach(this.flush(), (err) => this.#onError(asError(err))), intervalMs);
    this.#timer.unref();
  }

  touch(id: string, now: number): void {
    this.#pending.set(id, now);
  }

  /** Write what has gathered since the last batch (one store write, or none). */
  flush(): Promise<void> {
    if (this.#pending.size === 0) return this.#writing;
    const batch = new Map(this.#pending);
    this.#pending.clear();
    this.#writing = this.#writing
      .then(() => {
        const start = performance.now();
        const written = this.#store.recordUse(batch);
        this.#timed((performance.now() - start) / 1000);
        return written;
      })
      .catch((err: Error) => this.#onError(err));
    return this.#writing;
  }

  async stop(): Promise<void> {
    if (this.#timer !== null) clearInterval(this.#timer);
    this.#timer = null;
    await this.flush();
  }
}
