// A small reader for the Prometheus text format, for asserting on /metrics.
export interface Sample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

export interface Scrape {
  readonly samples: readonly Sample[];
  /** Names with a `# TYPE` line. */
  readonly declared: ReadonlySet<string>;
  /** Sum of the samples named `name` whose labels include `match`. */
  sum(name: string, match?: Readonly<Record<string, string>>): number;
}

export function parseProm(text: string): Scrape {
  const samples: Sample[] = [];
  const declared = new Set<string>();
  for (const line of text.split('\n')) {
    if (line.startsWith('# TYPE ')) declared.add(line.split(' ')[2] as string);
    if (line === '' || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (m === null) throw new Error(`not a sample line: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1] as string] = l[2] as string;
    samples.push({ name: m[1] as string, labels, value: Number(m[3]) });
  }
  return {
    samples,
    declared,
    sum: (name, match = {}) =>
      samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v)).reduce((a, s) => a + s.value, 0),
  };
}
