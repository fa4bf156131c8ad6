// The one way to start work nobody waits for. A rejected promise nobody
// handles ends the process (Node's default since v15,
// https://nodejs.org/api/cli.html#--unhandled-rejectionsmode), so every
// promise left to run on its own says where its rejection goes; the lint
// (no-floating-promises with ignoreVoid off) holds src/ to it.

/** Let `work` run; a rejection goes to `onError`. */
export function detach(work: PromiseLike<unknown>, onError: (err: unknown) => void): void {
  work.then(undefined, onError);
}

/** For work built never to reject (it catches inside): should that change, the process stays up. */
export const neverRejects = (): void => undefined;
