// What a caller adds to the panel beside its tables (`Annotations(bars=..., grid=...)`): bar
// charts of a pass's numbers (a patching effect per position), and a grid of numbers with a
// row per pass (layers x positions), coloured on a scale that starts at 0.
const BAR_WIDTH = 150, BAR_HEIGHT = 10;

// Where 0 sits on a bar or colour scale of `values`: the scale always holds 0, and is
// symmetric around it where the values have both signs (or are all negative).
function zeroScale(values) {
  const known = values.filter((v) => typeof v === "number" && Number.isFinite(v));
  const lo = Math.min(0, ...known), hi = Math.max(0, ...known);
  const m = Math.max(Math.abs(lo), Math.abs(hi));
  return lo < 0 ? { lo: -m, hi: m, stops: DIVERGING } : { lo: 0, hi, stops: SEQUENTIAL };
}

function barsHtml(p) {
  const found = DATA.bars && DATA.bars.passes[p.label];
  if (!found) return "";
  return found.map(([layout, values]) => {
    const [title, names] = DATA.bars.layouts[layout];
    const scale = zeroScale(values), span = scale.hi - scale.lo || 1;
    const x = (v) => ((v - scale.lo) / span) * BAR_WIDTH;
    const lines = names.map((name, i) => {
      const v = values[i], from = Math.min(x(0), x(v)), width = Math.abs(x(v) - x(0));
      const bar = `<svg class="bar" width="${BAR_WIDTH}" height="${BAR_HEIGHT}">` +
        `<line class="axis" x1="${x(0).toFixed(1)}" y1="0" x2="${x(0).toFixed(1)}" y2="${BAR_HEIGHT}"/>` +
        `<rect class="${v < 0 ? "neg" : "pos"}" x="${from.toFixed(1)}" y="1" width="${width.toFixed(1)}" ` +
        `height="${BAR_HEIGHT - 2}"/></svg>`;
      return `<tr data-name="${esc(name)}" data-value="${v}"><td>${esc(name)}</td><td>${bar}</td><td>${num(v)}</td></tr>`;
    });
    return `<section class="torchlog-bars" data-title="${esc(title)}"><h3>${esc(title)}</h3>` +
      `<table>${lines.join("")}</table></section>`;
  }).join("");
}

// The caller's grid, drawn with a pass that is one of its rows (that row outlined); a click
// on a cell selects the row's pass.
function gridHtml(p) {
  const grid = DATA.grid;
  if (!grid || !grid.rows.includes(p.label)) return "";
  const scale = zeroScale(grid.values.flat());
  const left = 110, top = 14, width = 330, cellH = 12;
  const cellW = Math.max(2, (width - left) / grid.columns.length);
  const colour = (v) => (v === null ? NO_VALUE :
    rampColour(scale.stops, scale.hi > scale.lo ? (v - scale.lo) / (scale.hi - scale.lo) : 0));
  const cells = grid.rows.map((label, r) => {
    const y = top + r * cellH, pass = passByLabel.get(label);
    const where = pass && pass.modules.length ? `${pass.modules[0]} ` : "";
    const name = `<text x="${left - 4}" y="${y + cellH - 3}" text-anchor="end"${label === p.label ? ' font-weight="bold"' : ""}>` +
      `${esc((where + label).slice(-22))}</text>`;
    const row = grid.values[r].map((v, c) => `<a data-goto="${esc(label)}"><rect x="${(left + c * cellW).toFixed(1)}" ` +
      `y="${y}" width="${cellW.toFixed(1)}" height="${cellH}" fill="${colour(v)}" data-row="${esc(label)}" ` +
      `data-column="${esc(grid.columns[c])}" data-value="${v === null ? "" : v}"><title>${esc(label)} @ ` +
      `${esc(grid.columns[c])}: ${v === null ? "no value" : num(v)}</title></rect></a>`).join("");
    const mark = label === p.label ? `<rect class="current" x="${left}" y="${y}" width="${(cellW * grid.columns.length).toFixed(1)}" height="${cellH}"/>` : "";
    return name + row + mark;
  }).join("");
  const heads = grid.columns.map((c, i) => (grid.columns.length <= 24 || i % Math.ceil(grid.columns.length / 24) === 0 ?
    `<text x="${(left + (i + 0.5) * cellW).toFixed(1)}" y="${top - 3}" text-anchor="middle">${esc(c)}</text>` : "")).join("");
  const height = top + grid.rows.length * cellH + 2;
  return `<section id="torchlog-grid" data-title="${esc(grid.title)}"><h3>${esc(grid.title)}</h3>` +
    `<svg width="${width}" height="${height}" viewBox="0 0 ${width} ${height}">${heads}${cells}</svg>` +
    `<div class="bar" style="background: linear-gradient(to right, ${scale.stops.join(", ")})"></div>` +
    `<div class="ends"><span>${tickText(scale.lo)}</span><span>${tickText(scale.hi)}</span></div></section>`;
}
