// The panel: what was recorded about the selected pass, layer, module or failure.
// ----- the panel ----------------------------------------------------------------------------------
function esc(text) {
  return String(text).replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}

function cssEscape(text) {
  return window.CSS && CSS.escape ? CSS.escape(text) : String(text).replace(/"/g, '\\"');
}

function shapeText(shape) {
  return shape.length === 1 ? `(${shape[0]},)` : `(${shape.join(", ")})`;
}

function humanSize(bytes) {
  const units = ["B", "KB", "MB", "GB"];
  let value = bytes, i = 0;
  while (Math.abs(value) >= 1024 && i < units.length - 1) { value /= 1024; i++; }
  return i === 0 ? `${value} B` : `${value.toFixed(1)} ${units[i]}`;
}

function num(value) {
  if (value === null || value === undefined) return "\u2013";
  if (Number.isInteger(value)) return String(value);
  const abs = Math.abs(value);
  return abs !== 0 && (abs < 1e-3 || abs >= 1e5) ? value.toExponential(4) : value.toPrecision(5);
}

// What a pass's time is (PassRecord.elapsed_s), for the tooltip on it.
const OP_TIME_NOTE = "wall time of the torch call alone: saving and other capture work are not in it; " +
  "CUDA ops are asynchronous, so without profile=True it is the launch";

function link(label, text) {
  return `<a data-goto="${esc(label)}">${esc(text || label)}</a>`;
}

function moduleLink(key) {
  return `<a data-goto-module="${esc(key)}">${esc(key)}</a>`;
}

function rows(pairs) {
  return "<table>" + pairs.filter(([, v]) => v !== null && v !== undefined && v !== "")
    .map(([k, v]) => `<tr><td>${esc(k)}</td><td>${v}</td></tr>`).join("") + "</table>";
}

function siteHtml(site) {
  if (!site) return null;
  // The line number stays on one line with its colon, however narrow the panel.
  const where = site.line === null ? esc(site.file) :
    `${esc(site.file)}<span class="line">:${site.line}</span> in ${esc(site.func)}`;
  return `<code>${where}</code>` + (site.text ? `<pre>${esc(site.text)}</pre>` : "");
}

// Why a page has no statistics at all: the log kept no activation.
const NO_VALUES_TEXT = "This log saved no activations (logged with layers_to_save=None, or loaded " +
  "without its values), so the page shows the structure only: no statistics, histograms, heatmaps " +
  "or colours by a statistic. Log with layers_to_save='all' (the default) to see them.";

function statsHtml(p) {
  if (!DATA.numSaved) return `<p class="no-values">${esc(NO_VALUES_TEXT)}</p>`;
  if (!p.saved) return "<p>Activation not saved.</p>";
  const s = p.stats;
  if (!s) return "<p>Saved (no statistics: not a tensor).</p>";
  const bad = (n) => (n ? `<span class="warn">${n}</span>` : "0");
  if (p.before) {
    return beforeAfterHtml(p.before, s, bad) + beforeAfterCharts(p.before, s, p.acted) + (s.heat ? heatmapHtml(s.heat, p.before.slice) : "");
  }
  const table = rows([["min", num(s.min)], ["max", num(s.max)],
    ["mean", num(s.mean)], ["std", num(s.std)], ["zeros", (100 * s.zeros).toFixed(1) + " %"], ["NaN", bad(s.nan)],
    ["Inf", bad(s.inf)], ...maskedRow(s), ["elements", String(s.numel)]]);
  return table + (s.hist ? histogramSvg({ lo: s.min, hi: s.max, counts: s.hist }) + logToggleHtml() : "") +
    (s.heat ? heatmapHtml(s.heat) : "");
}

// A mask's fills (finfo.min or finfo.max, as additive attention masks hold) are counted apart
// from every other figure, the histogram and the heatmap's scale.
function maskedRow(s) {
  if (!s.masked) return [];
  return [["masked", `${(100 * s.masked / s.numel).toFixed(1)} % <small>(${s.masked} entries at the dtype's ` +
    "finfo.min or finfo.max: a mask's fill, left out of the figures above)</small>"]];
}

// An intervened pass: each statistic of the value before the first action and of the value saved.
function beforeAfterHtml(b, s, bad) {
  const pct = (z) => (100 * z).toFixed(1) + " %";
  const line = ([name, before, after]) => `<tr><td>${name}</td><td>${before}</td><td>${after}</td></tr>`;
  return '<table id="torchlog-before-after"><tr><td></td><td><b>before</b></td><td><b>after</b></td></tr>' + [
    ["min", num(b.min), num(s.min)], ["max", num(b.max), num(s.max)], ["mean", num(b.mean), num(s.mean)],
    ["std", num(b.std), num(s.std)], ["zeros", pct(b.zeros), pct(s.zeros)], ["NaN", bad(b.num_nan), bad(s.nan)],
    ["Inf", bad(b.num_inf), bad(s.inf)], ["elements", String(b.numel), String(s.numel)],
  ].map(line).join("") + "</table>";
}

// Tables a caller added for this pass (`to_html(annotations=...)`), each under its title.
const VALUE_TITLE = DATA.valueTitle || "Activation";
function sectionsHtml(p) {
  const found = DATA.sections && DATA.sections.passes[p.label];
  if (!found) return "";
  return found.map(([layout, values]) => {
    const [title, names] = DATA.sections.layouts[layout];
    const cells = names.map((name, i) => [name, typeof values[i] === "number" ? num(values[i]) : esc(values[i])]);
    const hist = DATA.histograms && DATA.histograms[p.label] && DATA.histograms[p.label][title];
    const chart = hist ? histogramSvg({ ...hist, name: title }) : "";
    return `<section class="torchlog-section" data-title="${esc(title)}"><h3>${esc(title)}</h3>${rows(cells)}${chart}</section>`;
  }).join("");
}

function valueHtml(p, heading) {
  return (heading ? `<h3>${esc(VALUE_TITLE)}</h3>` : "") + statsHtml(p) + sectionsHtml(p) + barsHtml(p) +
    (heading ? gridHtml(p) : "");
}

function passRows(p) {
  const modules = p.modules.length ? p.modules.map(moduleLink).join(" \u2039 ") : "(top level)";
  return rows([
    ["function", `<code>${esc(p.func)}</code>`],
    ["kind", esc(p.kind) + (p.inplace ? " (in-place)" : "")],
    ["intervened", p.interventions ? p.interventions.map(esc).join("<br>") : null],
    ["pass", p.npasses > 1 ? `${p.pass} of ${p.npasses}` : null],
    ["shape", esc(shapeText(p.shape))],
    ["dtype", esc(p.dtype)],
    ["size", humanSize(p.bytes)],
    ["address", p.address ? `<code>${esc(p.address)}</code>` : null],
    ["in modules", modules],
    ["output of", p.outputOf ? p.outputOf.map(moduleLink).join(", ") : null],
    ["call's outputs", p.outputs ? p.outputs.map((l) => link(l)).join(", ") : null],
    ["output of call", p.callOf ? `${link(p.callOf)} (output ${passIndexInCall(p) + 1})` : null],
    ["call site", siteHtml(p.site)],
    ["params", p.params ? p.params.map(([a, s, n]) => `<code>${esc(a)}</code> ${esc(shapeText(s))}, ${n}`).join("<br>") : null],
    ["time", p.timeUs ? `<span title="${OP_TIME_NOTE}">${p.timeUs} \u00b5s</span>` : null],
    ["parents", p.parents.length ? p.parents.map(([l, arg]) => link(l) + (arg ? ` <small>(${esc(arg)})</small>` : "")).join("<br>") : "none"],
    ["children", p.children.length ? p.children.map((l) => link(l)).join("<br>") : "none"],
    ["gradient", p.grad ? `${esc(shapeText(p.grad.shape))}, norm ${num(p.grad.norm)}` : null],
  ]);
}

function passIndexInCall(p) {
  return passByLabel.get(p.callOf).outputs.indexOf(p.label);
}

function showPass(p) {
  panelHistograms.length = 0;
  panelHeats.length = 0;
  ui.panel.innerHTML = `<h2>${esc(p.label)}</h2>` + passRows(p) + valueHtml(p, true);
}

function showLayer(layer) {
  panelHistograms.length = 0;
  panelHeats.length = 0;
  const passes = layer.passes.map((l) => passByLabel.get(l));
  const first = passes[0];
  let html = `<h2>${esc(layer.label)}${passes.length > 1 ? ` (x${passes.length})` : ""}</h2>`;
  if (passes.length === 1) { ui.panel.innerHTML = html + passRows(first) + valueHtml(first, true); return; }
  html += rows([["function", `<code>${esc(first.func)}</code>`], ["kind", esc(first.kind)],
    ["passes", String(passes.length)], ["call site", siteHtml(first.site)]]);
  const chart = passesChartSvg(passes);
  if (chart) html += "<h3>Over the passes</h3>" + chart + '<p class="legend">mean (line), mean \u00b1 std (band), min and max (dots)</p>';
  ui.panel.innerHTML = html + '<h3>Passes</h3><div id="torchlog-passes"></div>';
  ui.panel.scrollTop = 0;
  showPassPage(layer, 0);
}

// A layer's passes, PASS_PAGE at a time (a loop of 5,000 passes would build 5,000 sections).
const PASS_PAGE = 50;

function showPassPage(layer, page) {
  const list = el("torchlog-passes");
  if (!list) return;
  const count = layer.passes.length, pages = Math.ceil(count / PASS_PAGE);
  const at = Math.max(0, Math.min(pages - 1, page)), start = at * PASS_PAGE;
  const shown = layer.passes.slice(start, start + PASS_PAGE).map((l) => passByLabel.get(l));
  const button = (to, text, off) => `<button type="button" data-pass-page="${to}"${off ? " disabled" : ""}>${text}</button>`;
  const pager = pages < 2 ? "" : `<nav class="pager" data-layer="${esc(layer.label)}">` +
    button(0, "\u00ab", at === 0) + button(at - 1, "\u2039 previous", at === 0) +
    ` passes ${start + 1}-${start + shown.length} of ${count} ` +
    button(at + 1, "next \u203a", at === pages - 1) + button(pages - 1, "\u00bb", at === pages - 1) + "</nav>";
  list.innerHTML = pager + shown.map((p, i) => `<details${i === 0 && at === 0 ? " open" : ""}><summary>pass ${p.pass}: ` +
    `${esc(shapeText(p.shape))}${p.stats && (p.stats.nan || p.stats.inf) ? ' <span class="warn">NaN/Inf</span>' : ""}` +
    "</summary>" + passRows(p) + valueHtml(p, false) + "</details>").join("");
  list.dataset.page = String(at);
}

function showModule(moduleKey) {
  showPath(moduleKey);
  storeSelection(MODULE_PREFIX + moduleKey);
  const rolled = state.mode === "rolled";
  const call = rolled ? null : DATA.calls[moduleKey];
  const address = rolled ? moduleKey : (call ? call.address : moduleKey);
  const module = DATA.modules[address];
  const shapes = (list) => (list && list.length ? list.map(shapeText).map(esc).join(", ") : null);
  const inside = DATA.passes.filter((p) => chains[state.mode].get(p.label).includes(moduleKey)).length;
  ui.panel.innerHTML = `<h2>${esc(moduleKey)}</h2>` + rows([
    ["type", module ? esc(module.type) : null],
    ["calls", module ? String(module.calls) : null],
    ["this call", call && module && module.calls > 1 ? `${call.call} of ${module.calls}` : null],
    ["parameters", module ? module.params.toLocaleString() : null],
    ["input shapes", shapes((call || module || {}).inputs)],
    ["output shapes", shapes((call || module || {}).outputs)],
    ["ops inside", String(inside)],
    ["state", state.expanded.has(moduleKey) ? "expanded" : "collapsed"],
    ["submodules", module && module.children.length ? module.children.map(esc).join(", ") : null],
  ]);
}

function showFailure() {
  const f = DATA.failure;
  // Each tensor argument: its slot, the pass that made it (a link) or the parameter it is.
  const inputs = f.args.map(([source, shape, dtype, slot], i) => {
    const from = source === null ? "(unlogged tensor)" : passByLabel.has(source) ? link(source) : `<code>${esc(source)}</code>`;
    return `${esc(slot || String(i))}: ${from} <small>${shape ? esc(shapeText(shape)) : "(no shape)"}, ${esc(dtype)}</small>`;
  });
  ui.panel.innerHTML = `<h2 class="error">forward pass failed</h2>` +
    `<p class="error">${esc(f.text)}</p>` + (f.error ? `<pre class="error">${esc(f.error)}</pre>` : "") +
    rows([["function", f.func ? `<code>${esc(f.func)}</code>` : "(Python code between ops)"],
      ["in module", f.module ? moduleLink(f.module) : "(top level)"],
      ["call site", siteHtml(f.site)],
      ["inputs", inputs.length ? inputs.join("<br>") : "none"]]);
}

function onPanelClick(ev) {
  const pageButton = ev.target.closest("button[data-pass-page]");
  if (pageButton) {
    showPassPage(layerByLabel.get(pageButton.closest("nav").dataset.layer), Number(pageButton.dataset.passPage));
    return;
  }
  const a = ev.target.closest("a");
  if (!a) return;
  if (a.dataset.goto) goTo(a.dataset.goto);
  else if (a.dataset.gotoModule) goToModule(a.dataset.gotoModule);
}
