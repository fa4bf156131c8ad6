// Where a JSON text stops being JSON, for a message that names the line and
// column of a damaged keys file without quoting its contents (JSON.parse's
// own message quotes the text around the fault, and often gives no position).
// A strict recursive-descent reading of RFC 8259; pure.

const WS = new Set([0x20, 0x09, 0x0a, 0x0d]);
const NUMBER = /-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?/y;
// RFC 8259 §7: control characters U+0000 to U+001F must be escaped in a string.
// eslint-disable-next-line no-control-regex
const STRING = /"(?:[^"\\\u0000-\u001f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"/y;

/** The offset of the first character that makes `text` not JSON, or null when it parses. */
/** Where the scan stopped: thrown to leave the recursion at once. */
class NotJson extends Error {
  readonly at: number;
  constructor(at: number) {
    super(`not JSON at ${at}`);
    this.at = at;
  }
}

export function jsonErrorOffset(text: string): number | null {
  let i = 0;
  const fail = (): never => {
    throw new NotJson(i);
  };
  const ws = (): void => {
    while (i < text.length && WS.has(text.charCodeAt(i))) i++;
  };
  const match = (re: RegExp): boolean => {
    re.lastIndex = i;
    if (!re.test(text)) return false;
    i = re.lastIndex;
    return true;
  };
  const value = (): void => {
    ws();
    const c = text[i];
    if (c === '{' || c === '[') {
      const close = c === '{' ? '}' : ']';
      i++;
      ws();
      if (text[i] === close) return void i++;
      for (;;) {
        if (c === '{') {
          ws();
          if (!match(STRING)) fail();
          ws();
          if (text[i] !== ':') fail();
          i++;
        }
        value();
        ws();
        if (text[i] === ',') i++;
        else if (text[i] === close) return void i++;
        else fail();
      }
    }
    if (c === '"') return void (match(STRING) || fail());
    for (const word of ['true', 'false', 'null']) if (text.startsWith(word, i)) return void (i += word.length);
    if (!match(NUMBER)) fail();
  };
  try {
    value();
    ws();
    return i === text.length ? null : i;
  } catch (err) {
    if (err instanceof NotJson) return err.at;
    throw err;
  }
}

/** ` at line L, column C` (1-based) of the first fault in `text`, or '' when none is found. */
export function jsonErrorWhere(text: string): string {
  const at = jsonErrorOffset(text);
  if (at === null) return '';
  const before = text.slice(0, at);
  return ` at line ${before.split('\n').length}, column ${at - before.lastIndexOf('\n')}`;
}
