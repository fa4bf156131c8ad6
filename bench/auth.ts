// What authentication costs one request, measured directly: `authenticate`
// (request/pipeline.ts) for a Bearer token on a keep-alive connection, with
// the connection's memo (keys/token.ts, TokenMemo: the same token's shape,
// checksum and SHA-256 worked out once per connection) and without it (every
// request checked and hashed). Interleaved rounds, medians, ns per request.
//   node --import tsx bench/auth.ts [N]
import { loadConfig } from '../src/config/load.ts';
import { KeySet } from '../src/keys/keyset.ts';
import { generateToken, tokenDigest, TokenMemo } from '../src/keys/token.ts';
import { CredentialBoard } from '../src/request/credentials.ts';
import { buildRuntime } from '../src/process/runtime.ts';
import { Capacity } from '../src/capacity/capacity.ts';
import { authenticate } from '../src/request/pipeline.ts';
import { UPSTREAMS } from '../src/request/routes.ts';

const n = Number(process.argv[2] ?? 500_000);
const config = loadConfig(
  { KEYWARD_SCRAPER_TOKEN: 'bench-scraper-secret', KEYWARD_SPEECH_KEY: 'bench-speech-secret', KEYWARD_SEO_URL: 'http://127.0.0.1:1' },
  () => '',
  '/',
  UPSTREAMS,
);
const rt = buildRuntime(config, new CredentialBoard(), new Capacity(config, () => true));
const token = generateToken();
const keys = new KeySet([
  { id: 'key_bench', name: 'bench', digest: `sha256:${tokenDigest(token)}`, created: '2026-01-01T00:00:00Z', expires: null, revoked: null },
]);
const headers = { authorization: `Bearer ${token}` };

function run(memo: TokenMemo | null): number {
  const start = process.hrtime.bigint();
  for (let i = 0; i < n; i++) {
    const found = authenticate(headers, '/scraper/v2/acts/x/runs', rt.table, keys, 1, memo);
    if (typeof found === 'string') throw new Error(`the bench token was refused: ${found}`);
  }
  return Number(process.hrtime.bigint() - start) / n;
}

run(null);
run(new TokenMemo());
const without: number[] = [];
const withMemo: number[] = [];
for (let round = 0; round < 7; round++) {
  without.push(run(null));
  withMemo.push(run(new TokenMemo()));
}
const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;
process.stdout.write(
  `${JSON.stringify({ n, everyRequestNs: Math.round(median(without)), sameConnectionNs: Math.round(median(withMemo)), rounds: { everyRequest: without.map(Math.round), sameConnection: withMemo.map(Math.round) } })}\n`,
);
