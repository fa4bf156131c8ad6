// How amounts and instants are written wherever keyward shows them (JSON
// answers, alerts, the CLI), so that one figure reads the same everywhere.

/** An amount to the micro-unit (a millionth of a dollar, of a character): what sums of floats leave past it is noise. */
export const micro = (n: number): number => Math.round(n * 1e6) / 1e6;

/** An amount rounded down to the micro-unit: a cap or a grant never rounds up. */
export const floorMicro = (n: number): number => Math.floor(n * 1e6 + 1e-6) / 1e6;

/** An instant (ms) as RFC 3339 UTC, without milliseconds when it falls on a second (https://www.rfc-editor.org/rfc/rfc3339). */
export const rfc3339 = (ms: number): string => new Date(ms).toISOString().replace('.000Z', 'Z');
