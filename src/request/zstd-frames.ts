// Where a zstd stream's blocks end (RFC 8878 §3.1). A streaming zstd
// decoder outputs nothing of a compressed block until the whole block has
// arrived, and such a block may store short literals as they are: released
// chunk by chunk, a block's raw literals (a secret among them) would reach
// the client before their decoded form was scanned. So compressed bytes are
// released only up to the end of the last complete block, frame header,
// checksum or skippable frame (relay.ts). Pure: counts bytes, keeps none.

const FRAME_MAGIC = 0xfd2fb528;
/** 0x184D2A50 to 0x184D2A5F (RFC 8878 §3.1.2). */
const SKIPPABLE_MAGIC = 0x184d2a50;

type Field = 'magic' | 'descriptor' | 'block header' | 'skip size';

export class ZstdFrames {
  /** Bytes seen. */
  #seen = 0;
  /** The end of the last complete element: bytes before it decode to what the decoder has output. */
  safe = 0;
  /** Reading a small field: which, and its bytes so far. */
  #field: Field | null = 'magic';
  #bytes: number[] = [];
  /** Otherwise: bytes left in the current element, and what follows it. */
  #skip = 0;
  #then: 'block header' | 'magic' | 'checksum' = 'block header';
  #checksum = false;

  push(chunk: Uint8Array): void {
    let i = 0;
    while (i < chunk.length) {
      if (this.#field === null) {
        const n = Math.min(this.#skip, chunk.length - i);
        this.#skip -= n;
        i += n;
        this.#seen += n;
        if (this.#skip === 0) this.#complete();
        continue;
      }
      this.#bytes.push(chunk[i] as number);
      i++;
      this.#seen++;
      this.#read(this.#field);
    }
  }

  /** An element ends here; the next begins with `#then`. */
  #complete(): void {
    this.safe = this.#seen;
    const next = this.#then;
    if (next === 'checksum') {
      this.#expect(4, 'magic');
    } else {
      this.#field = next;
      this.#bytes = [];
    }
  }

  #expect(skip: number, then: 'block header' | 'magic' | 'checksum'): void {
    this.#field = null;
    this.#bytes = [];
    this.#skip = skip;
    this.#then = then;
    if (skip === 0) this.#complete();
  }

  #read(field: Field): void {
    const b = this.#bytes;
    const le = (n: number): number => b.slice(0, n).reduceRight((v, x) => v * 256 + x, 0);
    if (field === 'magic' && b.length === 4) {
      const magic = le(4);
      if (magic === FRAME_MAGIC) {
        this.#field = 'descriptor';
        this.#bytes = [];
      } else if ((magic & 0xfffffff0) >>> 0 === SKIPPABLE_MAGIC) {
        this.#field = 'skip size';
        this.#bytes = [];
      } else {
        // Not zstd: the decoder fails on it; nothing more is ever safe.
        this.#expect(Infinity, 'magic');
      }
    } else if (field === 'descriptor') {
      const d = b[0] as number;
      const single = (d >> 5) & 1;
      this.#checksum = ((d >> 2) & 1) === 1;
      const dictionary = [0, 1, 2, 4][d & 3] as number;
      const contentSize = [single, 2, 4, 8][d >> 6] as number;
      this.#expect((single === 1 ? 0 : 1) + dictionary + contentSize, 'block header');
    } else if (field === 'skip size' && b.length === 4) {
      this.#expect(le(4), 'magic');
    } else if (field === 'block header' && b.length === 3) {
      const h = le(3);
      const last = (h & 1) === 1;
      const type = (h >> 1) & 3;
      const size = h >>> 3;
      // An RLE block is one byte repeated `size` times (RFC 8878 §3.1.1.2.2).
      const body = type === 1 ? 1 : size;
      this.#expect(body, last ? (this.#checksum ? 'checksum' : 'magic') : 'block header');
    }
  }
}
