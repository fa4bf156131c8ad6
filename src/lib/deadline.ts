// The one deadline race: what `work` gives if it is done within `ms`, else
// `late`. A rejection of `work` within `ms` rejects (catch it first to treat
// it as late). The timer is cleared either way and never holds the process.

export function within<T, L>(work: Promise<T>, ms: number, late: L): Promise<T | L> {
  if (!Number.isFinite(ms)) return work;
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<L>((resolve) => {
    timer = setTimeout(() => resolve(late), Math.max(0, ms));
    timer.unref();
  });
  return Promise.race([work, timeout]).finally(() => clearTimeout(timer));
}
