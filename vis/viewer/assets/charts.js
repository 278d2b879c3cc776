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
  const top_ = Math.max(size(peak), 1e-12);
  const step = (hist.hi - hist.lo) / counts.length;
  // The value axis: the histogram's own range, or a shared one (`axis`: before and after an
  // intervention drawn one above the other), each bar where its values lie.
  const [a, b] = hist.axis || [hist.lo, hist.hi];
  const x = (v) => left + (b > a ? ((v - a) / (b - a)) * (width - left) : 0);
  const bars = counts.map((c, i) => {
    const h = c > 0 ? Math.max(1, (size(c) / top_) * height) : 0;
    const from = hist.lo + i * step, to = i === counts.length - 1 ? hist.hi : hist.lo + (i + 1) * step;
    const w = step > 0 ? x(to) - x(from) : (width - left) / counts.length;
    return `<rect x="${x(from).toFixed(1)}" y="${(top + height - h).toFixed(1)}" data-count="${c}" ` +
      `width="${Math.max(w - 1, 1).toFixed(1)}" height="${h.toFixed(1)}">` +
      `<title>[${tickText(from)}, ${tickText(to)}${i === counts.length - 1 ? "]" : ")"}: ${c}</title></rect>`;
  }).join("");
  const y0 = top + height, mid = (a + b) / 2;
  const axes = `<line class="axis" x1="${left - 1}" y1="${top}" x2="${left - 1}" y2="${y0}"/>` +
    `<line class="axis" x1="${left - 1}" y1="${y0}" x2="${width}" y2="${y0}"/>` +
    `<text class="count" x="${left - 4}" y="${top + 8}" text-anchor="end">${peak}</text>` +
    `<text class="count" x="${left - 4}" y="${y0}" text-anchor="end">0</text>` +
    `<text x="${left}" y="${y0 + 12}">${tickText(a)}</text>` +
    `<text x="${(left + width) / 2}" y="${y0 + 12}" text-anchor="middle">${tickText(mid)}</text>` +
    `<text x="${width}" y="${y0 + 12}" text-anchor="end">${tickText(b)}</text>`;
  return `<svg class="hist" width="${width}" height="${y0 + axis}" viewBox="0 0 ${width} ${y0 + axis}" ` +
    `data-log="${log}"${hist.name ? ` data-name="${esc(hist.name)}"` : ""}>${bars}${axes}</svg>`;
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

// A rolled layer's passes: mean (line), mean +- std (band), min and max (dots) per pass. A
// generation's steps draw the same chart, `unit` 'step' (each entry's `pass` its number).
function passesChartSvg(passes, unit = "pass") {
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
    `<rect class="hit" x="${(x(i) - 3).toFixed(1)}" y="${top}" width="6" height="${height}"><title>${unit} ${passes[i].pass}: ` +
    `mean ${tickText(s.mean)}, std ${tickText(s.std)}, min ${tickText(s.min)}, max ${tickText(s.max)}</title></rect>` : "")).join("");
  const y0 = top + height;
  return `<svg class="passes" width="${width}" height="${y0 + axis}" viewBox="0 0 ${width} ${y0 + axis}">` +
    `<polygon class="band" points="${band}"/><polyline class="mean" points="${path((s) => s.mean)}"/>${dots}` +
    `<line class="axis" x1="${left - 1}" y1="${top}" x2="${left - 1}" y2="${y0}"/>` +
    `<line class="axis" x1="${left - 1}" y1="${y0}" x2="${width}" y2="${y0}"/>` +
    `<text class="count" x="${left - 4}" y="${top + 8}" text-anchor="end">${tickText(hi)}</text>` +
    `<text class="count" x="${left - 4}" y="${y0}" text-anchor="end">${tickText(lo)}</text>` +
    `<text x="${left}" y="${y0 + 12}">${unit} ${passes[0].pass}</text>` +
    `<text x="${width}" y="${y0 + 12}" text-anchor="end">${unit} ${passes[passes.length - 1].pass}</text></svg>`;
}

// A 2-D slice of the value (computed when the page was built): cells coloured from lo to hi.
const HEAT_STOPS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"];

const HEAT_HOLE = "#9a9a9a";  // cells holding only NaN, Inf or a mask's fill

// The value's 2-D slices the page holds (the first, then `more` along dimension `along`): the
// panel shows one, chosen in its slice box, with its axes named and its own scale.
const panelHeats = [];

// `lead`: the leading indices of a slice to open on (an intervention's acted-on slice), when
// the picker holds it; the first slice otherwise.
function heatmapHtml(heat, lead) {
  const index = panelHeats.push(heat) - 1;
  const count = 1 + (heat.more ? heat.more.length : 0);
  const dims = heat.shape.length;
  const held = lead && heat.along !== undefined && lead.every((v, d) => d === heat.along || v === 0);
  const start = held && lead[heat.along] < count ? lead[heat.along] : 0;
  const picker = count < 2 ? "" : `<label class="heat-pick">slice along dim ${heat.along} ` +
    `(${heat.shape[heat.along]}; heads or channels): <select data-heat="${index}">` +
    [...Array(count).keys()].map((i) => `<option value="${i}"${i === start ? " selected" : ""}>${i}</option>`).join("") + "</select>" +
    (heat.shape[heat.along] > count ? ` <small>(the first ${count})</small>` : "") + "</label>";
  return `<div class="heat" data-heat="${index}">${picker}<div class="heat-body">${heatBody(heat, start)}</div>` +
    `<p class="legend axes">rows: dim ${dims - 2} (${heat.shape[dims - 2]}), columns: dim ${dims - 1} (${heat.shape[dims - 1]})</p></div>`;
}

function heatBody(heat, which) {
  const picture = which === 0 ? heat : heat.more[which - 1];
  const lead = heat.shape.slice(0, -2).map((_, d) => (d === heat.along ? which : 0));
  const slice = `[${[...lead, ":", ":"].join(", ")}]`;
  if (!picture) return `<p class="legend">slice ${esc(slice)} holds no finite value</p>`;
  const [fullRows, fullCols] = heat.shape.slice(-2);
  const averaged = picture.rows < fullRows || picture.cols < fullCols;
  return heatImage(picture, `data-slice="${which}"`) +
    `<div class="bar" style="background: linear-gradient(to right, ${HEAT_STOPS.join(", ")})"></div>` +
    `<div class="ends"><span>${tickText(picture.lo)}</span><span>${tickText(picture.hi)}</span></div>` +
    `<p class="legend">slice ${esc(slice)} of ${esc(shapeText(heat.shape))}` +
    `${averaged ? `, averaged to ${picture.rows} x ${picture.cols}` : ""}</p>` +
    (picture.holes ? `<p class="legend holes"><i style="background: ${HEAT_HOLE}"></i> masked, NaN or Inf: not on the scale</p>` : "");
}

// An intervened pass: the histograms of the value before the first action and of the value
// kept, one above the other on one value axis, and the slice the action acted on (the
// ablated head), before and after, on one scale.
function beforeAfterCharts(before, s, acted) {
  let html = "";
  if (before.counts && s.hist && before.min !== null && s.min !== null) {
    const axis = [Math.min(before.min, s.min), Math.max(before.max, s.max)];
    html += ["before", "after"].map((name) => {
      const [v, counts] = name === "before" ? [before, before.counts] : [s, s.hist];
      return `<p class="legend">${name}</p>` + histogramSvg({ lo: v.min, hi: v.max, counts, axis, name });
    }).join("") + logToggleHtml();
  }
  if (!acted) return html;
  const picture = (name) => {
    const p = acted[name];
    return `<figure data-name="${name}">${heatImage(p, "", 160)}<figcaption>${name}</figcaption></figure>`;
  };
  return html + `<div class="heat acted" data-slice="${esc(acted.slice)}"><p class="legend">slice acted on: ` +
    `${esc(acted.slice)} of ${esc(shapeText(acted.shape))}</p><div class="pair">${picture("before")}${picture("after")}</div>` +
    `<div class="bar" style="background: linear-gradient(to right, ${HEAT_STOPS.join(", ")})"></div>` +
    `<div class="ends"><span>${tickText(acted.before.lo)}</span><span>${tickText(acted.before.hi)}</span></div></div>`;
}

// One picture as an image, its cells in the heatmap colours (holes grey).
function heatImage(picture, attributes = "", side = 240) {
  const bytes = atob(picture.cells), holes = picture.holes ? atob(picture.holes) : null;
  const canvas = document.createElement("canvas");
  canvas.width = picture.cols;
  canvas.height = picture.rows;
  const ctx = canvas.getContext("2d");
  const image = ctx.createImageData(picture.cols, picture.rows);
  for (let i = 0; i < bytes.length; i++) {
    const [r, g, b] = hexToRgb(holes && holes.charCodeAt(i) ? HEAT_HOLE : rampColour(HEAT_STOPS, bytes.charCodeAt(i) / 255));
    image.data.set([r, g, b, 255], 4 * i);
  }
  ctx.putImageData(image, 0, 0);
  const ratio = picture.rows / picture.cols;
  const [w, h] = ratio > 1 ? [side / ratio, side] : [side, side * ratio];
  return `<img src="${canvas.toDataURL("image/png")}" width="${w.toFixed(0)}" height="${h.toFixed(0)}" ` +
    `alt="heatmap" data-rows="${picture.rows}" data-cols="${picture.cols}" data-lo="${picture.lo}" ` +
    `data-hi="${picture.hi}" ${attributes}>`;
}
