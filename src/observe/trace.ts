// The trace id of a client's W3C `traceparent` header, for the request's log
// line (docs/logs.md): the header itself goes upstream untouched, so a
// request can be followed from the client's trace through keyward's lines.
// Pure. https://www.w3.org/TR/trace-context/#traceparent-header

const HEX = /^[0-9a-f]+$/;

/**
 * The header's trace id when it is well formed, else null: `version-traceid-
 * parentid-flags`, lower-case hex of 2, 32, 16 and 2 digits, version not
 * `ff`, neither id all zeros. Version `00` has exactly those four fields; a
 * later version may add more after another `-` (§4.3), read the same way.
 * Anything else is left out of the line rather than logged as sent.
 */
export function traceIdOf(header: string | string[] | undefined): string | null {
  // Several traceparent headers are invalid (§3.2): which one the upstream would follow is unknown.
  if (typeof header !== 'string' || header.length < 55) return null;
  if (header.charCodeAt(2) !== 0x2d || header.charCodeAt(35) !== 0x2d || header.charCodeAt(52) !== 0x2d) return null;
  const version = header.slice(0, 2);
  if (version === 'ff' || !HEX.test(version)) return null;
  if (header.length > 55 && (version === '00' || header.charCodeAt(55) !== 0x2d)) return null;
  const traceId = header.slice(3, 35);
  const parentId = header.slice(36, 52);
  if (!HEX.test(traceId) || !HEX.test(parentId) || !HEX.test(header.slice(53, 55))) return null;
  if (/^0+$/.test(traceId) || /^0+$/.test(parentId)) return null;
  return traceId;
}
