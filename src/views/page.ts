// The usage page (docs/limits.md, "The usage page"): one server-rendered
// HTML document with inline SVG charts, no script and no framework, readable
// without JavaScript and on a phone. Every figure a chart draws is also in a
// table below it, and every bar carries its numbers as data attributes and a
// <title>, so what the chart shows can be checked. Pure: report in, text out.
import type { Report } from './report.ts';

const esc = (s: string): string => s.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const num = (n: number): string => (Number.isInteger(n) ? String(n) : String(Math.round(n * 1e4) / 1e4));
const COLOURS = ['#2563eb', '#d97706', '#059669', '#db2777', '#7c3aed', '#0891b2'];
/** Room above the top line, in the chart's units (px). */
const TOP = 10;

/** The least of 1, 2 or 5 times a power of ten at or above `n` (> 0): a scale a reader can take in. */
export function roundUp(n: number): number {
  const p = 10 ** Math.floor(Math.log10(n));
  for (const m of [1, 2, 5, 10]) if (m * p >= n * (1 - 1e-12)) return m * p;
  return 10 * p;
}

/** A bar chart of `series` per day (stacked by route); `field`'s value per bar in data attributes. */
function chart(report: Report, routes: readonly string[], field: 'requests' | 'cost', title: string, id: string, colour: (route: string) => string): string {
  const W = 600;
  const H = 160;
  const per = new Map<string, Map<string, number>>();
  for (const t of report.daily) {
    if (!routes.includes(t.route)) continue;
    const m = per.get(t.day) ?? new Map<string, number>();
    m.set(t.route, (m.get(t.route) ?? 0) + t[field]);
    per.set(t.day, m);
  }
  const totals = report.days.map((d) => [...(per.get(d)?.values() ?? [])].reduce((a, b) => a + b, 0));
  const highest = Math.max(0, ...totals);
  const range = `${report.days[0]} to ${report.days[report.days.length - 1]}`;
  if (highest === 0) {
    // Nothing to draw: say so rather than show an empty box.
    return `<figure id="${id}"><figcaption>${esc(title)}</figcaption>
<p class="empty">Nothing ${field === 'cost' ? 'spent' : 'forwarded'}${routes.length === 0 ? '' : ` on ${routes.map(esc).join(', ')}`} in these 30 days (${range}).</p></figure>`;
  }
  // The top of the scale: a round figure (1, 2 or 5 times a power of ten) at or above the highest day, and a line at half.
  const max = roundUp(highest);
  const bw = W / report.days.length;
  const bars: string[] = [];
  report.days.forEach((day, i) => {
    let y = H;
    for (const route of routes) {
      const v = per.get(day)?.get(route) ?? 0;
      if (v === 0) continue;
      const h = (v / max) * (H - TOP);
      y -= h;
      bars.push(
        `<rect class="bar" x="${(i * bw + 1).toFixed(1)}" y="${y.toFixed(1)}" width="${(bw - 2).toFixed(1)}" height="${h.toFixed(1)}" fill="${colour(route)}" data-day="${day}" data-route="${esc(route)}" data-${field}="${num(v)}"><title>${day} ${esc(route)}: ${num(v)}</title></rect>`,
      );
    }
  });
  // Day labels under the bars, a week apart and ending today; HTML rather than
  // SVG text, which the stretched viewBox would distort. The last is pinned to
  // the right edge so it never sticks out of a phone's screen.
  const n = report.days.length;
  const ticks: string[] = [];
  for (let i = n - 1; i >= 0; i -= 7) {
    const at = i === n - 1 ? 'right:0' : `left:${(((i + 0.5) / n) * 100).toFixed(2)}%`;
    ticks.unshift(
      `<span class="${i === n - 1 ? 'tick end' : 'tick'}" style="${at}" data-day="${report.days[i]}">${(report.days[i] as string).slice(5)}</span>`,
    );
  }
  const legend = routes.map((r) => `<span class="key"><i style="background:${colour(r)}"></i>${esc(r)}</span>`).join(' ');
  const mid = TOP + (H - TOP) / 2;
  // Value labels in HTML over the chart (SVG text would be stretched with it), at the lines' heights in px (the SVG is H px tall).
  const values = `<span class="value" style="top:${TOP}px">${num(max)}</span><span class="value" style="top:${mid}px">${num(max / 2)}</span>`;
  return `<figure id="${id}"><figcaption>${esc(title)} · highest ${num(highest)} a day</figcaption>
<div class="plot"><svg viewBox="0 0 ${W} ${H}" role="img" aria-label="${esc(title)}" preserveAspectRatio="none"><line x1="0" y1="${H}" x2="${W}" y2="${H}" stroke="#999"/><line class="grid" x1="0" y1="${TOP}" x2="${W}" y2="${TOP}"/><line class="grid" x1="0" y1="${mid}" x2="${W}" y2="${mid}"/>${bars.join('')}</svg>${values}</div>
<div class="axis" aria-hidden="true">${ticks.join('')}</div>
<p class="legend">${legend} · ${range}</p></figure>`;
}

const link = (params: { key?: string | null; route?: string | null }): string => {
  const q = new URLSearchParams();
  if (params.key) q.set('key', params.key);
  if (params.route) q.set('route', params.route);
  const s = q.toString();
  return s === '' ? '/usage' : `/usage?${s}`;
};

/** The page's own style: no external sheet, so the admin listener serves one response. */
const STYLE = `body{font:15px/1.4 system-ui,sans-serif;margin:0 auto;max-width:960px;padding:12px;color:#111}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.6em}
figure{margin:0 0 1em}svg{display:block;width:100%;height:160px;background:#fafafa;border:1px solid #ddd;box-sizing:border-box}
.plot{position:relative}.grid{stroke:#ddd;stroke-dasharray:4 4}.value{position:absolute;left:4px;transform:translateY(-50%);font-size:.75em;color:#555;background:#fafafa;padding:0 2px}
.empty{height:160px;margin:0;display:flex;align-items:center;justify-content:center;background:#fafafa;border:1px solid #ddd;color:#555;text-align:center;padding:0 1em;box-sizing:border-box}
table{border-collapse:collapse;width:100%;font-size:.9em;display:block;overflow-x:auto}
table.fit{display:table}table.fit td{white-space:normal}table.fit td:first-child{overflow-wrap:anywhere}
th,td{padding:3px 8px;border-bottom:1px solid #eee;text-align:right;white-space:nowrap}th:first-child,td:first-child{text-align:left}
.axis{position:relative;height:1.3em;font-size:.75em;color:#555}.tick{position:absolute;transform:translateX(-50%);white-space:nowrap}.tick.end{transform:none}
.key i{display:inline-block;width:10px;height:10px;margin-right:4px}.legend{font-size:.85em;color:#555}
tr.past td{color:#b91c1c;font-weight:600}tr.near td{color:#b45309}
form{display:flex;flex-wrap:wrap;gap:8px;align-items:end}label{display:flex;flex-direction:column;font-size:.85em}
input,select,button{font:inherit;padding:4px}
`;

/** The page for `report`; `units` names each route's cost unit (null: it reports none). */
export function renderPage(report: Report, routes: readonly string[], units: (route: string) => string | null, at: string): string {
  const f = report.filter;
  // A route the filter names that does not exist shows nothing, and says so (as a key nobody has does).
  const shown = f.routeText === null ? routes : routes.filter((r) => r === f.route);
  const costly = shown.filter((r) => units(r) !== null);
  // A route keeps its colour in every chart.
  const colour = (r: string): string => COLOURS[Math.max(0, routes.indexOf(r)) % COLOURS.length] as string;
  const rows = report.days
    .map((d) => {
      const cells = shown.map((r) => {
        const t = report.daily.find((x) => x.day === d && x.route === r);
        return `<td>${t === undefined ? 0 : num(t.requests)}</td>${units(r) === null ? '' : `<td>${t === undefined ? 0 : num(t.cost)}</td>`}`;
      });
      return `<tr><th scope="row">${d}</th>${cells.join('')}</tr>`;
    })
    .reverse()
    .join('\n');
  const head = shown
    .map((r) => `<th scope="col">${esc(r)} requests</th>${units(r) === null ? '' : `<th scope="col">${esc(r)} cost (${esc(units(r) as string)})</th>`}`)
    .join('');
  const name = (k: { name: string; id: string } | null, id: string): string => (k === null ? esc(id) : `${esc(k.name)} <small>${esc(k.id)}</small>`);
  const top =
    report.top.length === 0
      ? '<p>No requests today.</p>'
      : `<table class="fit"><thead><tr><th scope="col">key</th><th scope="col">requests</th><th scope="col">cost</th></tr></thead><tbody>${report.top
          .map(
            (t) =>
              `<tr><td><a href="${esc(link({ key: t.keyId, route: f.route }))}">${name(t.key, t.keyId)}</a></td><td>${num(t.requests)}</td><td>${
                Object.entries(t.cost)
                  .map(([r, c]) => `${esc(r)} ${num(c)} ${esc(units(r) ?? '')}`)
                  .join(', ') || '—'
              }</td></tr>`,
          )
          .join('')}</tbody></table>`;
  const near =
    report.near.length === 0
      ? '<p>No key is at 80 % of a quota or budget.</p>'
      : `<table class="fit"><thead><tr><th scope="col">key</th><th scope="col">limit</th><th scope="col">used</th><th scope="col">share</th></tr></thead><tbody>${report.near
          .map(
            (n) =>
              `<tr class="${n.share >= 1 ? 'past' : 'near'}"><td><a href="${esc(link({ key: n.key.id }))}">${name(n.key, n.key.id)}</a></td><td>${esc(n.limit)}</td><td>${num(n.used)} of ${num(n.value)}</td><td>${Math.round(n.share * 100)} %</td></tr>`,
          )
          .join('')}</tbody></table>`;
  const routeLinks = [
    `<a href="${esc(link({ key: f.keyText }))}"${f.route === null ? ' aria-current="page"' : ''}>all routes</a>`,
    ...routes.map((r) => `<a href="${esc(link({ key: f.keyText, route: r }))}"${f.route === r ? ' aria-current="page"' : ''}>${esc(r)}</a>`),
  ].join(' · ');
  const scope = f.keyText === null ? 'every key' : f.key === null ? `no key named ${esc(f.keyText)}` : `key ${name(f.key, f.key.id)}`;
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>keyward usage</title>
<style>
${STYLE}</style></head><body>
<h1>Usage: ${scope}${f.routeText === null ? '' : f.route === null ? `, no route named ${esc(f.routeText)}` : `, route ${esc(f.route)}`}</h1>
<form method="get" action="/usage"><label>key (id or name)<input name="key" value="${esc(f.keyText ?? '')}"></label>
<label>route<select name="route"><option value="">all</option>${routes.map((r) => `<option${f.route === r ? ' selected' : ''}>${esc(r)}</option>`).join('')}</select></label>
<button type="submit">show</button> <a href="/usage">clear</a></form>
<p>${routeLinks}</p>
<h2>Last 30 days</h2>
${chart(report, shown, 'requests', 'Requests forwarded per day', 'requests-chart', colour)}
${costly.map((r) => chart(report, [r], 'cost', `Spend per day on ${r} (${units(r)})`, `cost-${r}`, colour)).join('\n')}
<details><summary>The numbers</summary>
<table id="daily"><thead><tr><th scope="col">day</th>${head}</tr></thead><tbody>
${rows}
</tbody></table></details>
<h2>Today's top keys</h2>
${top}
<h2>Near or past a limit</h2>
${near}
<p class="legend">As of ${esc(at)} (UTC). Usage of the last flush interval may not be in yet.</p>
</body></html>`;
}
