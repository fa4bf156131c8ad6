// Alerts to KEYWARD_ALERT_WEBHOOK (docs/limits.md, "Alerts"): a JSON POST,
// signed with `X-Keyward-Signature: sha256=<hex HMAC-SHA256 of the body>`
// when KEYWARD_ALERT_WEBHOOK_SECRET is set (the scheme GitHub's webhooks
// use). Sent one at a time, in the order they fired, each attempt bounded
// by a timeout; a failure is retried with exponential backoff (1 s doubling,
// at most 5 min apart, with jitter) until KEYWARD_ALERT_WEBHOOK_RETRY has
// passed since the alert fired. Never on the request path: a receiver that
// hangs holds only this queue.
import { createHmac } from 'node:crypto';
import { backoff, type Backoff } from '../lib/backoff.ts';
import { detach, neverRejects } from '../lib/detach.ts';

export interface WebhookOptions {
  readonly url: string;
  readonly secret: string | null;
  /** How long after an alert fired it is still tried, ms. */
  readonly retryMs: number;
  /** One attempt's limit, ms. */
  readonly timeoutMs?: number;
  /** The receiver answered 2xx. */
  onDelivered(id: string): void;
  /** An attempt failed (`gaveUp`: the retry window is over, the alert is dropped). */
  onFailed(id: string, reason: string, attempt: number, gaveUp: boolean): void;
  now?: () => number;
}

interface Pending {
  readonly id: string;
  readonly body: string;
  /** When the alert fired, ms. */
  readonly firedAt: number;
  attempts: number;
  next: number;
}

/** The most alerts waiting at once; past it the oldest is dropped (and said). */
const MAX_QUEUED = 10_000;
/** 1 s doubling, ±25 % jitter, never more than 5 min apart (docs/limits.md). */
export const RETRY: Backoff = { firstMs: 1_000, maxMs: 5 * 60_000, jitter: 0.25 };

/** The signature header's value for `body`. */
export function signature(secret: string, body: string): string {
  return `sha256=${createHmac('sha256', secret).update(body).digest('hex')}`;
}

export class Webhook {
  readonly #o: WebhookOptions;
  readonly #now: () => number;
  readonly #queue: Pending[] = [];
  readonly #ids = new Set<string>();
  #timer: NodeJS.Timeout | null = null;
  #sending = false;
  #stopped = false;
  /** The attempt under way, if any: a drain waits for it, so that a delivery is not sent again by the next start. */
  #attempting: Promise<void> | null = null;

  constructor(options: WebhookOptions) {
    this.#o = options;
    this.#now = options.now ?? Date.now;
  }

  /** Send this alert (once: an id already waiting is not queued twice). */
  send(id: string, body: string, firedAt: number): void {
    if (this.#stopped || this.#ids.has(id)) return;
    if (this.#queue.length >= MAX_QUEUED) {
      const dropped = this.#queue.shift() as Pending;
      this.#ids.delete(dropped.id);
      this.#o.onFailed(dropped.id, 'queue full', dropped.attempts, true);
    }
    this.#queue.push({ id, body, firedAt, attempts: 0, next: 0 });
    this.#ids.add(id);
    this.#pump();
  }

  /** Resolves once no attempt is under way (at once when none is). */
  idle(): Promise<void> {
    return this.#attempting ?? Promise.resolve();
  }

  stop(): void {
    this.#stopped = true;
    if (this.#timer !== null) clearTimeout(this.#timer);
    this.#timer = null;
  }

  #pump(): void {
    if (this.#sending || this.#stopped) return;
    const head = this.#queue[0];
    if (head === undefined) return;
    const wait = head.next - this.#now();
    if (wait > 0) {
      if (this.#timer === null) {
        this.#timer = setTimeout(() => {
          this.#timer = null;
          this.#pump();
        }, wait);
        this.#timer.unref();
      }
      return;
    }
    this.#sending = true;
    const attempt = this.#attempt(head).finally(() => {
      this.#sending = false;
      this.#attempting = null;
      this.#pump();
    });
    this.#attempting = attempt;
    detach(attempt, neverRejects);
  }

  async #attempt(p: Pending): Promise<void> {
    p.attempts++;
    const headers: Record<string, string> = { 'content-type': 'application/json', 'user-agent': 'keyward' };
    if (this.#o.secret !== null) headers['x-keyward-signature'] = signature(this.#o.secret, p.body);
    let reason: string | null = null;
    try {
      const res = await fetch(this.#o.url, {
        method: 'POST',
        headers,
        body: p.body,
        signal: AbortSignal.timeout(this.#o.timeoutMs ?? 10_000),
        redirect: 'manual',
      });
      // The body is not read: only the status matters, and the connection goes back to the pool.
      await res.body?.cancel().catch(() => undefined);
      if (res.status < 200 || res.status > 299) reason = `status ${res.status}`;
    } catch (err) {
      const e = err as Error & { cause?: { code?: string } };
      reason = e.cause?.code ?? e.name;
    }
    if (reason === null) {
      this.#drop(p);
      this.#o.onDelivered(p.id);
      return;
    }
    p.next = this.#now() + backoff(p.attempts, RETRY);
    const gaveUp = p.next - p.firedAt > this.#o.retryMs;
    if (gaveUp) this.#drop(p);
    this.#o.onFailed(p.id, reason, p.attempts, gaveUp);
  }

  #drop(p: Pending): void {
    const i = this.#queue.indexOf(p);
    if (i >= 0) this.#queue.splice(i, 1);
    this.#ids.delete(p.id);
  }
}
