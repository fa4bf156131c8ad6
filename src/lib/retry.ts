// Asking again until it works: `work` run until it succeeds, on the one
// backoff (lib/backoff.ts), never after `stop`. For writes a later start
// depends on (an alert marked delivered) and reads a start needs (the alerts
// not delivered before the last stop).
import { backoff } from './backoff.ts';
import { detach, neverRejects } from './detach.ts';

export class Retrier {
  #stopped = false;
  readonly #waiting = new Set<NodeJS.Timeout>();

  /** `work` until it succeeds: again `firstMs` later, doubling to 30 s, at most `tries` times in all. Never rejects. */
  run(work: () => Promise<void>, firstMs: number, tries: number, attempt = 1): Promise<void> {
    return work().catch(() => {
      if (this.#stopped || attempt >= tries) return;
      const t = setTimeout(
        () => {
          this.#waiting.delete(t);
          detach(this.run(work, firstMs, tries, attempt + 1), neverRejects);
        },
        backoff(attempt, { firstMs, maxMs: 30_000 }),
      ).unref();
      this.#waiting.add(t);
    });
  }

  stop(): void {
    this.#stopped = true;
    for (const t of this.#waiting) clearTimeout(t);
    this.#waiting.clear();
  }
}
