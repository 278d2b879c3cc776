// Small charts in the panel: a value's histogram with axes (counts linear or log), and a
// rolled layer's statistics over its passes.
const panelHistograms = [];  // the histograms the panel shows, redrawn when the scale changes

function tickText(value) {
  return esc(num(value));
}

// A histogram with its count axis (0 and the tallest bin) and value axis (min, middle, max);
// each bar's tooltip gives its range and count.
function histogramSvg(hist) {
  const index = panelHistograms.push(hist) - 1;
  return `<div class="hist-box" data-hist="${index}">${histogramBody(hist)}</div>`;
}

function histogramBody(hist) {
  const counts = hist.counts, width = 300, height = 64, left = 40, top = 4, axis = 16;
  const log = state.histLog;
  const size = (c) => (log ? Math.log10(1 + c) : c);
  const peak = Math.max(...counts);
  const top_ = Math.max(size(peak), 1e-12), barW = (width - left) / counts.length;
  const step = (hist.hi - hist.lo) / counts.length;
  const bars = counts.map((c, i) => {
    const h = c > 0 ? Math.max(1, (size(c) / top_) * height) : 0;
    const from = hist.lo + i * step, to = i === counts.length - 1 ? hist.hi : hist.lo + (i + 1) * step;
    return `<rect x="${(left + i * barW).toFixed(1)}" y="${(top + height - h).toFixed(1)}" ` +
      `width="${Math.max(barW - 1, 1).toFixed(1)}" height="${h.toFixed(1)}">` +
      `<title>[${tickText(from)}, ${tickText(to)}${i === counts.length - 1 ? "]" : ")"}: ${c}</title></rect>`;
  }).join("");
  const y0 = top + height, mid = (hist.lo + hist.hi) / 2;
  const axes = `<line class="axis" x1="${left - 1}" y1="${top}" x2="${left - 1}" y2="${y0}"/>` +
    `<line class="axis" x1="${left - 1}" y1="${y0}" x2="${width}" y2="${y0}"/>` +
    `<text class="count" x="${left - 4}" y="${top + 8}" text-anchor="end">${peak}</text>` +
    `<text class="count" x="${left - 4}" y="${y0}" text-anchor="end">0</text>` +
    `<text x="${left}" y="${y0 + 12}">${tickText(hist.lo)}</text>` +
    `<text x="${(left + width) / 2}" y="${y0 + 12}" text-anchor="middle">${tickText(mid)}</text>` +
    `<text x="${width}" y="${y0 + 12}" text-anchor="end">${tickText(hist.hi)}</text>`;
  return `<svg class="hist" width="${width}" height="${y0 + axis}" viewBox="0 0 ${width} ${y0 + axis}" ` +
    `data-log="${log}">${bars}${axes}</svg>`;
}

function logToggleHtml() {
  return `<label class="hist-log"><input type="checkbox" id="torchlog-hist-log"${state.histLog ? " checked" : ""}> ` +
    "log counts</label>";
}

function redrawHistograms() {
  for (const box of ui.panel.querySelectorAll(".hist-box")) {
    box.innerHTML = histogramBody(panelHistograms[Number(box.dataset.hist)]);
  }
}

function installCharts() {
  ui.panel.addEventListener("change", (ev) => {
    if (ev.target.dataset && ev.target.dataset.heat !== undefined) {
      const heat = panelHeats[Number(ev.target.dataset.heat)];
      ev.target.closest(".heat").querySelector(".heat-body").innerHTML = heatBody(heat, Number(ev.target.value));
      return;
    }
    if (ev.target.id !== "torchlog-hist-log") return;
    state.histLog = ev.target.checked;
    redrawHistograms();
  });
}

// A rolled layer's passes: mean (line), mean +- std (band), min and max (dots) per pass.
function passesChartSvg(passes) {
  const points = passes.map((p) => p.stats && p.stats.min !== null ? p.stats : null);
  const known = points.filter(Boolean);
  if (known.length < 2) return "";
  const lo = Math.min(...known.map((s) => Math.min(s.min, s.mean - s.std)));
  const hi = Math.max(...known.map((s) => Math.max(s.max, s.mean + s.std)));
  // The value axis's labels fit left of it, minus sign and all (about 6 px a character).
  const labelChars = Math.max(num(lo).length, num(hi).length);
  const width = 300, height = 80, left = Math.max(40, 8 + 6 * labelChars), top = 6, axis = 16;
  const span = hi > lo ? hi - lo : 1;
  const x = (i) => left + (passes.length === 1 ? 0 : (i * (width - left - 4)) / (passes.length - 1));
  const y = (v) => top + height - ((v - lo) / span) * height;
  const path = (f) => points.map((s, i) => (s ? `${x(i).toFixed(1)},${y(f(s)).toFixed(1)}` : null)).filter(Boolean).join(" ");
  const band = points.map((s, i) => (s ? [x(i), y(s.mean + s.std)] : null)).filter(Boolean)
    .concat(points.map((s, i) => (s ? [x(i), y(s.mean - s.std)] : null)).filter(Boolean).reverse())
    .map(([a, b]) => `${a.toFixed(1)},${b.toFixed(1)}`).join(" ");
  const dots = points.map((s, i) => (s ? `<circle class="min" cx="${x(i).toFixed(1)}" cy="${y(s.min).toFixed(1)}" r="1.6"/>` +
    `<circle class="max" cx="${x(i).toFixed(1)}" cy="${y(s.max).toFixed(1)}" r="1.6"/>` +
    `<rect class="hit" x="${(x(i) - 3).toFixed(1)}" y="${top}" width="6" height="${height}"><title>pass ${passes[i].pass}: ` +
    `mean ${tickText(s.mean)}, std ${tickText(s.std)}, min ${tickText(s.min)}, max ${tickText(s.max)}</title></rect>` : "")).join("");
  const y0 = top + height;
  return `<svg class="passes" width="${width}" height="${y0 + axis}" viewBox="0 0 ${width} ${y0 + axis}">` +
    `<polygon class="band" points="${band}"/><polyline class="mean" points="${path((s) => s.mean)}"/>${dots}` +
    `<line class="axis" x1="${left - 1}" y1="${top}" x2="${left - 1}" y2="${y0}"/>` +
    `<line class="axis" x1="${left - 1}" y1="${y0}" x2="${width}" y2="${y0}"/>` +
    `<text class="count" x="${left - 4}" y="${top + 8}" text-anchor="end">${tickText(hi)}</text>` +
    `<text class="count" x="${left - 4}" y="${y0}" text-anchor="end">${tickText(lo)}</text>` +
    `<text x="${left}" y="${y0 + 12}">pass 1</text>` +
    `<text x="${width}" y="${y0 + 12}" text-anchor="end">pass ${passes.length}</text></svg>`;
}

// A 2-D slice of the value (computed when the page was built): cells coloured from lo to hi.
const HEAT_STOPS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"];

const HEAT_HOLE = "#9a9a9a";  // cells holding only NaN, Inf or a mask's fill

// The value's 2-D slices the page holds (the first, then `more` along dimension `along`): the
// panel shows one, chosen in its slice box, with its axes named and its own scale.
const panelHeats = [];

function heatmapHtml(heat) {
  const index = panelHeats.push(heat) - 1;
  const count = 1 + (heat.more ? heat.more.length : 0);
  const dims = heat.shape.length;
  const picker = count < 2 ? "" : `<label class="heat-pick">slice along dim ${heat.along} ` +
    `(${heat.shape[heat.along]}; heads or channels): <select data-heat="${index}">` +
    [...Array(count).keys()].map((i) => `<option value="${i}">${i}</option>`).join("") + "</select>" +
    (heat.shape[heat.along] > count ? ` <small>(the first ${count})</small>` : "") + "</label>";
  return `<div class="heat" data-heat="${index}">${picker}<div class="heat-body">${heatBody(heat, 0)}</div>` +
    `<p class="legend axes">rows: dim ${dims - 2} (${heat.shape[dims - 2]}), columns: dim ${dims - 1} (${heat.shape[dims - 1]})</p></div>`;
}

function heatBody(heat, which) {
  const picture = which === 0 ? heat : heat.more[which - 1];
  const lead = heat.shape.slice(0, -2).map((_, d) => (d === heat.along ? which : 0));
  const slice = `[${[...lead, ":", ":"].join(", ")}]`;
  if (!picture) return `<p class="legend">slice ${esc(slice)} holds no finite value</p>`;
  const bytes = atob(picture.cells);
  const canvas = document.createElement("canvas");
  canvas.width = picture.cols;
  canvas.height = picture.rows;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(picture.cols, picture.rows);
  const holes = picture.holes ? atob(picture.holes) : null;
  for (let i = 0; i < bytes.length; i++) {
    const hole = holes && holes.charCodeAt(i);
    const [r, g, b] = hexToRgb(hole ? HEAT_HOLE : rampColour(HEAT_STOPS, bytes.charCodeAt(i) / 255));
    image.data.set([r, g, b, 255], 4 * i);
  }
  ctx.putImageData(image, 0, 0);
  const [fullRows, fullCols] = heat.shape.slice(-2);
  const averaged = picture.rows < fullRows || picture.cols < fullCols;
  const side = 240, ratio = picture.rows / picture.cols;
  const [w, h] = ratio > 1 ? [side / ratio, side] : [side, side * ratio];
  return `<img src="${canvas.toDataURL("image/png")}" width="${w.toFixed(0)}" height="${h.toFixed(0)}" ` +
    `alt="heatmap" data-rows="${picture.rows}" data-cols="${picture.cols}" data-slice="${which}">` +
    `<div class="bar" style="background: linear-gradient(to right, ${HEAT_STOPS.join(", ")})"></div>` +
    `<div class="ends"><span>${tickText(picture.lo)}</span><span>${tickText(picture.hi)}</span></div>` +
    `<p class="legend">slice ${esc(slice)} of ${esc(shapeText(heat.shape))}` +
    `${averaged ? `, averaged to ${picture.rows} x ${picture.cols}` : ""}</p>` +
    (holes ? `<p class="legend holes"><i style="background: ${HEAT_HOLE}"></i> masked, NaN or Inf: not on the scale</p>` : "");
}
