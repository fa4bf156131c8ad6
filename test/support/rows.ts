// A usage ledger row for tests: `requests` all answered 2xx and nothing else
// counted, unless `over` says otherwise (one builder instead of one per file).
import type { UsageRow } from '../../src/ledger/store.ts';

export function usageRow(over: Partial<UsageRow> & Pick<UsageRow, 'keyId'>): UsageRow {
  const requests = over.requests ?? 1;
  return {
    route: 'seo',
    day: new Date().toISOString().slice(0, 10),
    requests,
    s2xx: requests,
    s3xx: 0,
    s4xx: 0,
    s5xx: 0,
    other: 0,
    limited: 0,
    bytesIn: 0,
    bytesOut: 0,
    cost: 0,
    ...over,
  };
}
