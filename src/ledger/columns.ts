// The ledger's row in SQL, as both stores select it (sqlite-store.ts,
// pg-usage.ts): the stored columns named as a UsageRow's fields. SQL text
// lives with the stores; the ledger (ledger.ts) knows none.

/** A stored row's columns as a UsageRow's fields (both stores name them key_id, bytes_in…); `num` may cast the counts. */
export function rowColumns(num: (column: string) => string = (c) => c, day = 'day'): string {
  const counts = ['requests', 's2xx', 's3xx', 's4xx', 's5xx', 'other', 'limited'].map((c) => `${num(c)} as ${c}`);
  return `key_id as "keyId", route, ${day} as day, ${counts.join(', ')}, ${num('bytes_in')} as "bytesIn", ${num('bytes_out')} as "bytesOut", cost`;
}
