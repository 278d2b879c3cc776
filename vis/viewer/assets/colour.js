// Colour by data: op nodes filled by a number per pass (a statistic of the saved activation,
// or the values a caller gave `to_html(colour_by=...)`), with a legend; by node kind otherwise.
// A rolled layer takes the value of largest magnitude among its passes, a collapsed module its
// output's (under a statistic; the largest under NaN + Inf and the caller's values);
// under the caller's colouring, a node with no value shows the caller's mark, if any (why).
const COLOUR_MEASURES = {
  custom: { title: () => DATA.colour.title, of: (p) => DATA.colour.values[p.label] },
  std: { title: () => "std", of: (p) => p.stats && p.stats.std },
  zeros: { title: () => "share of zeros", of: (p) => p.stats && p.stats.zeros },
  naninf: { title: () => "NaN + Inf count", of: (p) => p.stats && p.stats.nan + p.stats.inf },
  absmax: { title: () => "max |x|", of: (p) => p.stats && p.stats.min !== null ? Math.max(Math.abs(p.stats.min), Math.abs(p.stats.max)) : null },
};
const SEQUENTIAL = ["#fff7ec", "#fdd49e", "#fc8d59", "#d7301f", "#7f0000"];
const DIVERGING = ["#2166ac", "#92c5de", "#f7f7f7", "#f4a582", "#b2182b"];
const NO_VALUE = "#f2f2f2";
// Fills of the caller's marks (why a node has no value), apart from both scales and NO_VALUE;
// marked nodes are also outlined dashed.
const MARK_FILLS = ["#9e7bd9", "#66c2a5", "#e7d84a", "#8c6d31", "#e377c2", "#17becf"];
const MARK_DASH = "4,2";
const MARKS = (DATA.colour && DATA.colour.marks) || {};
const MARK_NAMES = (DATA.colour && DATA.colour.markNames) || [];
const colouring = { range: null };

function hexToRgb(hex) {
  return [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
}

// The colour at t in [0, 1] along evenly spaced `stops`.
function rampColour(stops, t) {
  const x = Math.max(0, Math.min(1, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(x)), f = x - i;
  const [a, b] = [hexToRgb(stops[i]), hexToRgb(stops[i + 1])];
  return "#" + a.map((v, k) => Math.round(v + (b[k] - v) * f).toString(16).padStart(2, "0")).join("");
}

function isDark(hex) {
  const [r, g, b] = hexToRgb(hex);
  return 0.299 * r + 0.587 * g + 0.114 * b < 120;
}

function valueOf(p) {
  const v = COLOUR_MEASURES[state.colour].of(p);
  return typeof v === "number" && Number.isFinite(v) ? v : null;
}

// The scale spans every pass's value, so it stays put as modules open and close. The
// caller's numbers (a difference, a patching effect) are measured from 0: their scale starts
// there, and is symmetric around it where the values have both signs.
function colourRange() {
  let lo = Infinity, hi = -Infinity;
  for (const p of DATA.passes) {
    const v = valueOf(p);
    if (v !== null) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  }
  if (lo > hi) return null;
  if (state.colour === "custom") { lo = Math.min(lo, 0); hi = Math.max(hi, 0); }
  // The caller's negative numbers keep 0 at the neutral middle too (a symmetric scale).
  const diverging = lo < 0 && (hi > 0 || state.colour === "custom");
  const m = Math.max(Math.abs(lo), Math.abs(hi));
  // One value only: the caller's 0 is the scale's start (nothing differs, no effect).
  const flat = state.colour === "custom" ? 0 : 0.5;
  return diverging ? { lo: -m, hi: m, stops: DIVERGING, flat } : { lo, hi, stops: SEQUENTIAL, flat };
}

function colourOf(value) {
  const r = colouring.range;
  if (value === null || !r) return NO_VALUE;
  return rampColour(r.stops, r.hi > r.lo ? (value - r.lo) / (r.hi - r.lo) : r.flat);
}

// A unit with no value under the caller's colouring shows the mark of its first marked pass.
function unitMark(unit) {
  if (state.colour !== "custom") return null;
  for (const p of unit.members) if (MARKS[p.label] !== undefined) return MARKS[p.label];
  return null;
}

// A collapsed module coloured by a statistic shows its output's (what it hands on), not the
// extreme of the ops inside it; NaN + Inf counts and a caller's values take the largest.
const BY_OUTPUT = new Set(["std", "zeros", "absmax"]);

function moduleOutputs(unit) {
  const key = unit.key.slice(MODULE_PREFIX.length), rolled = state.mode === "rolled";
  return unit.members.filter((p) => (p.outputOf || []).some((call) =>
    (rolled ? call.slice(0, call.lastIndexOf(":")) : call) === key));
}

function unitValue(unit) {
  let best = null;
  const outputs = unit.kind === "module" && BY_OUTPUT.has(state.colour) ? moduleOutputs(unit) : [];
  for (const p of outputs.length ? outputs : unit.members) {
    const v = valueOf(p);
    if (v !== null && (best === null || Math.abs(v) > Math.abs(best))) best = v;
  }
  return best;
}

// Fill the drawn nodes (no new layout); "kind" puts the kinds' own fills back.
function applyColours() {
  const drawn = state.drawn;
  if (!drawn) return;
  colouring.range = state.colour === "kind" ? null : colourRange();
  for (const g of drawn.svg.querySelectorAll("g.node")) {
    const info = drawn.built.ids.get(g.id);
    const shape = g.querySelector("polygon, ellipse, path");
    if (!info || !shape || info.unit.kind === "failed") continue;
    if (g.dataset.kindFill === undefined) {
      g.dataset.kindFill = shape.getAttribute("fill") || "";
      g.dataset.kindDash = shape.getAttribute("stroke-dasharray") || "";
    }
    let fill = g.dataset.kindFill, dash = g.dataset.kindDash;
    delete g.dataset.colourValue;
    delete g.dataset.mark;
    if (state.colour !== "kind") {
      const value = unitValue(info.unit);
      const mark = value === null ? unitMark(info.unit) : null;
      if (value !== null) g.dataset.colourValue = String(value);
      fill = colourOf(value);
      if (mark !== null) {
        g.dataset.mark = MARK_NAMES[mark];
        fill = MARK_FILLS[mark % MARK_FILLS.length];
        dash = MARK_DASH;
      }
    }
    g.querySelectorAll("polygon, ellipse, path").forEach((s) => {
      if (s.getAttribute("fill") !== "none") s.setAttribute("fill", fill);
      if (dash) s.setAttribute("stroke-dasharray", dash); else s.removeAttribute("stroke-dasharray");
    });
    const textColour = state.colour !== "kind" && isDark(fill) ? "white" : "";
    g.querySelectorAll("text").forEach((t) => { if (textColour) t.setAttribute("fill", textColour); else t.removeAttribute("fill"); });
  }
  showLegend();
}

function showLegend() {
  const legend = el("torchlog-legend"), r = colouring.range;
  legend.hidden = false;
  if (state.colour === "kind") { legend.innerHTML = kindLegend(); return; }
  const title = COLOUR_MEASURES[state.colour].title();
  const bar = r ? `<div class="bar" style="background: linear-gradient(to right, ${r.stops.join(", ")})"></div>` +
    `<div class="ends"><span>${esc(num(r.lo))}</span><span>${esc(num(r.hi))}</span></div>` : "<div>no values</div>";
  legend.innerHTML = `<b>${esc(title)}</b>${bar}<div><i style="background: ${NO_VALUE}"></i> no value</div>` +
    (state.colour === "custom" ? legendMarks() : "");
}

// The default colouring: what each fill of the drawn nodes means (only kinds drawn now).
function kindLegend() {
  const drawn = new Set(state.drawn ? [...state.drawn.placed.units.values()].map((u) => u.kind) : []);
  const plumbing = state.drawn && [...state.drawn.placed.units.values()]
    .some((u) => u.kind === "module" && isPlumbing(u.key.slice(MODULE_PREFIX.length)));
  const swatch = (fill, text, kind) => `<div class="kind" data-kind="${kind}"><i style="background: ${fill}"></i> ${esc(text)}</div>`;
  const items = Object.entries(DATA.dot.legend).filter(([kind]) => drawn.has(kind))
    .map(([kind, text]) => swatch((DATA.dot.kinds[kind] || {}).fillcolor || DATA.dot.node.fillcolor, text, kind));
  if (plumbing) items.push(swatch(PLUMBING_STYLE.fillcolor, "folded plumbing (masks, positions)", "plumbing"));
  return "<b>node colours</b>" + items.join("");
}

// The caller's marks, each with its fill, and notes (what the graph cannot show).
function legendMarks() {
  const marks = MARK_NAMES.map((name, i) => `<div class="mark" data-mark="${esc(name)}">` +
    `<i style="background: ${MARK_FILLS[i % MARK_FILLS.length]}; border-style: dashed"></i> ${esc(name)}</div>`);
  const notes = ((DATA.colour && DATA.colour.notes) || []).map((line) => `<div class="note">${esc(line)}</div>`);
  return marks.join("") + notes.join("");
}

async function setColour(name) {
  if (name !== "kind" && !COLOUR_MEASURES[name]) return false;
  if (name === "custom" && !DATA.colour) return false;
  state.colour = name;
  ui.colour.value = name;
  applyColours();
  drawOverview();
  return true;
}

function installColours() {
  if (DATA.colour) {
    const option = document.createElement("option");
    option.value = "custom";
    option.textContent = DATA.colour.title;
    ui.colour.insertBefore(option, ui.colour.options[1] || null);
  }
  ui.colour.value = state.colour;
  ui.colour.onchange = () => setColour(ui.colour.value);
  if (!DATA.numSaved) {  // nothing saved, no statistic to colour by
    for (const option of ui.colour.options) {
      if (option.value in COLOUR_MEASURES && option.value !== "custom") {
        option.disabled = true;
        option.title = NO_VALUES_TEXT;
      }
    }
  }
}
