// What was thrown, as an Error: JavaScript can throw anything, and a log
// line, a metric reason or a rejection wants a message and a stack.
export const asError = (err: unknown): Error => (err instanceof Error ? err : new Error(String(err)));
