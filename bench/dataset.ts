// A scraper dataset as the platform returns it (`run-sync-get-dataset-items`,
// `datasets/{id}/items`): a JSON array of items with URLs, titles, prose,
// numbers, dates and `\u` escapes, made from a fixed seed so every run (and
// every system) streams the same bytes. Exactly `size` bytes.

const WORDS = (
  'the of and to in is for on with as by at from this that are was be or an it not which have has more new all can will one about ' +
  'product price shipping review customer quality delivery store online offer brand model size color material warranty return ' +
  'design comfortable durable lightweight premium classic modern stainless steel cotton leather wireless battery screen camera ' +
  'kitchen garden outdoor travel office home sport music video gaming service support available stock order today free fast'
).split(' ');
const ACCENTED = ['\\u00e9dition', 'caf\\u00e9', 'na\\u00efve', '\\u00fcber', 'se\\u00f1or', 'r\\u00e9sum\\u00e9', '\\u2014', '\\u2019s', '\\u00a0'];
const HOSTS = ['www.example.com', 'shop.example.org', 'news.example.net', 'blog.example.io', 'store.example.co.uk'];

/** mulberry32: a small seeded generator, so the dataset is the same in every process. */
function random(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function prose(r: () => number, words: number): string {
  const out: string[] = [];
  for (let i = 0; i < words; i++)
    out.push(r() < 0.04 ? (ACCENTED[Math.floor(r() * ACCENTED.length)] as string) : (WORDS[Math.floor(r() * WORDS.length)] as string));
  return out.join(' ');
}

function item(r: () => number, i: number): string {
  const host = HOSTS[i % HOSTS.length] as string;
  const slug = prose(r, 3)
    .replace(/\\u[0-9a-f]{4}/g, 'x')
    .replace(/ /g, '-');
  const url = `https://${host}/products/${100000 + i}-${slug}?ref=dataset&page=${1 + (i % 40)}`;
  const title = prose(r, 4 + Math.floor(r() * 6));
  return JSON.stringify({
    url,
    title: '',
    description: '',
    price: Math.round(r() * 100000) / 100,
    currency: 'USD',
    rating: Math.round(r() * 50) / 10,
    reviews: Math.floor(r() * 20000),
    inStock: r() < 0.8,
    scrapedAt: new Date(Date.UTC(2026, 10, 1) + i * 61_000).toISOString(),
    images: [`https://cdn.${host}/img/${i}/1.jpg`, `https://cdn.${host}/img/${i}/2.jpg`],
    breadcrumbs: ['Home', 'Products', title.split(' ')[0] ?? 'Item'],
  })
    .replace('"title":""', `"title":"${title}"`)
    .replace('"description":""', `"description":"${prose(r, 30 + Math.floor(r() * 60))}"`);
}

/** The dataset: `[item,item,…]`, padded in its last item's `note` to exactly `size` bytes. */
export function dataset(size: number, seed = 1): Buffer {
  const r = random(seed);
  const parts: string[] = [];
  let length = 1;
  for (let i = 0; length < size - 4096; i++) {
    const s = item(r, i);
    parts.push(s);
    length += s.length + 1;
  }
  const head = `[${parts.join(',')},{"note":"`;
  const tail = '"}]';
  const pad = size - Buffer.byteLength(head) - tail.length;
  let note = '';
  while (note.length < pad) note += `${prose(r, 8)} `;
  return Buffer.from(head + note.slice(0, pad) + tail);
}
