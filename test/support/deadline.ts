// Every wait in the suite goes through this: a test that hangs fails instead.
export function deadline<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  const expired = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`deadline: ${what} did not happen within ${ms} ms`)), ms);
  });
  return Promise.race([promise, expired]).finally(() => clearTimeout(timer));
}

/** Poll `check` until it returns true, or fail after `ms`. */
export async function eventually(check: () => boolean | Promise<boolean>, ms: number, what: string): Promise<void> {
  const until = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > until) throw new Error(`deadline: ${what} did not hold within ${ms} ms`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
