// The key store seam (design §5): load the full set, watch for changes, apply
// a change. The file store below is one implementation; a shared store for a
// fleet (PostgreSQL, say) implements the same three calls and the request
// path does not change.
import type { KeyRecord } from './keyset.ts';

export interface Change<T> {
  readonly records: readonly KeyRecord[];
  readonly result: T;
}

export interface KeyStore {
  /** Where the keys live, for messages (never a secret). */
  readonly location: string;
  load(): Promise<readonly KeyRecord[]>;
  /**
   * Report every change within one second. `onError` gets changes that could
   * not be read; the caller keeps serving its last good set. Returns `stop`.
   */
  watch(onChange: (records: readonly KeyRecord[]) => void, onError: (err: Error) => void): () => void;
  /** Apply `change` to the current set under the store's lock and persist the result. */
  update<T>(change: (records: readonly KeyRecord[]) => Change<T>): Promise<T>;
}
