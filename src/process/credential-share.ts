// Credentials set aside, the same everywhere (docs/credentials.md, "Everywhere
// the same"): what one gateway process learns from an upstream's 429, 402 or
// 401 reaches the other workers of its machine through the primary at once,
// and every gateway of a fleet through PostgreSQL within a second (written
// at once, read by every gateway twice a second). Each carries the absolute
// instant it ends, so it comes back at the same moment on all. A gateway
// that cannot reach the database still applies what it sees itself.
import type { Worker } from 'node:cluster';
import type postgres from 'postgres';
import type { Aside, CredentialBoard } from '../request/credentials.ts';
import { instant } from '../keys/pg-schema.ts';
import { detach, neverRejects } from '../lib/detach.ts';

const ASIDE = 'keyward:credential-aside';

/** An Aside as a message (JSON has no Infinity: a 401's `until` travels as null). */
interface AsideMessage {
  readonly type: typeof ASIDE;
  readonly route: string;
  readonly label: number;
  readonly status: Aside['status'];
  readonly until: number | null;
  /** When a 401 was seen: a process reloaded since then does not take it back. */
  readonly at: number;
}

const toMessage = (a: Aside, at: number): AsideMessage => ({
  type: ASIDE,
  route: a.route,
  label: a.label,
  status: a.status,
  until: a.until === Infinity ? null : a.until,
  at,
});

function fromMessage(m: unknown): (Aside & { readonly at: number }) | null {
  const x = m as Partial<AsideMessage> | null;
  if (x?.type !== ASIDE || typeof x.route !== 'string' || typeof x.label !== 'number' || typeof x.at !== 'number') return null;
  if (x.status !== 401 && x.status !== 402 && x.status !== 429) return null;
  return { route: x.route, label: x.label, status: x.status, until: x.until === null || x.until === undefined ? Infinity : x.until, at: x.at };
}

/**
 * A 401 waits for a reload: one seen before this process's last reload (or
 * start) is not taken back from a peer. `since` is that instant.
 */
function applyIfCurrent(board: CredentialBoard, a: Aside & { readonly at: number }, since: () => number): void {
  if (a.status === 401 && a.at < since()) return;
  board.apply({ route: a.route, label: a.label, status: a.status, until: a.until });
}

/** In the primary: a worker's set-aside, applied to the board the machine's capacity chooses with (capacity/workers.ts). */
export function applyAside(board: CredentialBoard, m: unknown): void {
  const a = fromMessage(m);
  if (a !== null) board.apply({ route: a.route, label: a.label, status: a.status, until: a.until });
}

/** In a worker: what it sets aside goes to its primary; what the primary passes on is applied. */
export function shareWithPrimary(board: CredentialBoard, since: () => number): void {
  board.onAside((a, shared) => {
    if (!shared) process.send?.(toMessage(a, Date.now()));
  });
  process.on('message', (m: unknown) => {
    const a = fromMessage(m);
    if (a !== null) applyIfCurrent(board, a, since);
  });
}

/**
 * In the primary: each worker's set-aside passed to the others, and kept
 * (until it ends) for a worker that starts later. A reload forgets the 401s.
 */
export function relayAmongWorkers(workers: () => Iterable<Worker>): { joined(w: Worker): void; reloaded(): void; seen(from: Worker, m: unknown): void } {
  const held = new Map<string, AsideMessage>();
  return {
    seen(from, m) {
      const a = fromMessage(m);
      if (a === null) return;
      held.set(`${a.route}\u0000${a.label}`, toMessage(a, a.at));
      for (const w of workers()) if (w !== from && w.isConnected()) w.send(m as AsideMessage);
    },
    joined(w) {
      const now = Date.now();
      for (const [k, m] of held) {
        if (m.until !== null && m.until <= now) held.delete(k);
        else w.send(m);
      }
    },
    reloaded() {
      for (const [k, m] of held) if (m.status === 401) held.delete(k);
    },
  };
}

/** How often a fleet gateway reads what the others set aside, ms. */
export const FLEET_READ_MS = 500;

interface Fleet {
  bounded<T>(work: (sql: postgres.Sql) => Promise<T>): Promise<T>;
}

/**
 * In a fleet: what this gateway sets aside is written at once (a later
 * instant wins), and the table is read every FLEET_READ_MS. Returns a stop.
 */
export function shareInFleet(board: CredentialBoard, db: Fleet, since: () => number, onError: (err: Error) => void): () => void {
  let reading = false;
  let reported = false;
  const failed = (err: unknown): void => {
    if (reported) return;
    reported = true;
    onError(err as Error);
  };
  board.onAside((a, shared) => {
    if (shared) return;
    const until = a.until === Infinity ? 'infinity' : new Date(a.until).toISOString();
    detach(
      db
        .bounded(
          (sql) => sql`
            insert into keyward_credentials_aside (route, label, status, until, at)
            values (${a.route}, ${a.label}, ${a.status}, ${until}::timestamptz, now())
            on conflict (route, label) do update set status = excluded.status, until = excluded.until, at = excluded.at
              where keyward_credentials_aside.until < excluded.until or keyward_credentials_aside.status = 401`,
        )
        .then(() => (reported = false), failed),
      neverRejects,
    );
  });
  const read = async (): Promise<void> => {
    if (reading) return;
    reading = true;
    try {
      const rows = await db.bounded(
        (sql) => sql<Array<{ route: string; label: number; status: number; until: number; at: number }>>`
          select route, label, status, ${sql.unsafe(instant('until'))} * 1000 as until, ${sql.unsafe(instant('at'))} * 1000 as at
          from keyward_credentials_aside where until > now()`,
      );
      reported = false;
      for (const r of rows) {
        const a = fromMessage({ type: ASIDE, route: r.route, label: r.label, status: r.status, until: Number.isFinite(r.until) ? r.until : null, at: r.at });
        if (a !== null) applyIfCurrent(board, a, since);
      }
    } catch (err) {
      failed(err);
    } finally {
      reading = false;
    }
  };
  const timer = setInterval(() => detach(read(), neverRejects), FLEET_READ_MS);
  timer.unref();
  detach(read(), neverRejects);
  return () => clearInterval(timer);
}
