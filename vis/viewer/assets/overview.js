// Finding your way: an inset map of the whole graph with a "you are here" box, text hidden
// rather than drawn too small to read, and the module path of what the pointer is on (or of
// the selection) in a breadcrumb above the graph.
const OVERVIEW_SIDE = 180;  // px, the inset's longer side
// On-screen size (px) below which text is hidden: edge labels are drawn at 8 and node text at
// 10; once a node shows only its first line, that line grows as far as the node's width allows
// (to 1.2, 1.5 or 2 times) and sits in the node's middle; box titles grow 1.5 times.
const READABLE_PX = 6.5;
const TITLE_GROWTH = [["20", 2], ["15", 1.5], ["12", 1.2], ["10", 1]];
const overview = { el: el("torchlog-overview"), box: el("torchlog-overview-view"), k: 1, full: null };
overview.canvas = overview.el.querySelector("canvas");

// ----- level of detail ------------------------------------------------------------------------

function showDetail(scale) {
  const classes = ui.graph.classList;
  classes.toggle("torchlog-no-edge-text", 8 * scale < READABLE_PX);
  const titlesOnly = 10 * scale < READABLE_PX;
  classes.toggle("torchlog-titles-only", titlesOnly);
  for (const [name, k] of TITLE_GROWTH) classes.toggle("torchlog-hide-" + name, titlesOnly && 10 * k * scale < READABLE_PX);
}

// How many drawn nodes show no title at the current zoom.
function hiddenTitles() {
  const svg = state.drawn && state.drawn.svg;
  if (!svg) return 0;
  let hidden = 0;
  for (const text of svg.querySelectorAll("g.node > text:first-of-type")) {
    if (getComputedStyle(text).display === "none") hidden += 1;
  }
  return hidden;
}

// Where each node's first line goes when it is the only one shown: how much it may grow
// and how far it moves to the node's middle (from the SVG's attributes; no layout needed).
function prepareTitles(svg) {
  for (const g of svg.querySelectorAll("g.node")) {
    const text = g.querySelector("text");
    const shape = g.querySelector("polygon, ellipse");
    if (!text || !shape) continue;
    let middle, width;
    if (shape.tagName === "ellipse") {
      middle = Number(shape.getAttribute("cy"));
      width = 2 * Number(shape.getAttribute("rx")) * 0.8;
    } else {
      const points = shape.getAttribute("points").trim().split(/\s+/).map((p) => p.split(",").map(Number));
      const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
      middle = (Math.min(...ys) + Math.max(...ys)) / 2;
      width = Math.max(...xs) - Math.min(...xs);
    }
    const size = Number(text.getAttribute("font-size")) || 10;
    const room = (0.92 * width) / (0.56 * size * Math.max(1, text.textContent.length));
    const [name, k] = TITLE_GROWTH.find(([, k]) => k <= room) || TITLE_GROWTH[TITLE_GROWTH.length - 1];
    g.dataset.title = name;
    text.style.setProperty("--title-k", String(k));
    text.style.setProperty("--title-dy", (middle - (Number(text.getAttribute("y")) - 0.35 * size)).toFixed(1) + "px");
  }
}

// ----- the inset map --------------------------------------------------------------------------
// Where each node and box of the drawing is, in the SVG's viewBox units.
function drawnBoxes(svg) {
  const graph = svg.querySelector("g.graph");
  const m = graph.transform.baseVal.consolidate();
  const [a, d, e, f] = m ? [m.matrix.a, m.matrix.d, m.matrix.e, m.matrix.f] : [1, 1, 0, 0];
  const boxes = [];
  for (const g of graph.querySelectorAll(":scope > g.node, :scope > g.cluster")) {
    const b = g.getBBox();
    const shape = g.querySelector("polygon, ellipse, path");
    boxes.push({ x: a * b.x + e, y: d * b.y + f, w: a * b.width, h: d * b.height,
      cluster: g.classList.contains("cluster"), fill: shape && shape.getAttribute("fill") });
  }
  return boxes;
}

function drawOverview() {
  const drawn = state.drawn;
  overview.el.hidden = !drawn;
  if (!drawn) return;
  const full = overview.full = drawn.full || (drawn.full = graphBox(drawn.svg));
  const k = overview.k = OVERVIEW_SIDE / Math.max(full[2], full[3]);
  const w = Math.max(16, Math.round(full[2] * k)), h = Math.max(16, Math.round(full[3] * k));
  const ratio = window.devicePixelRatio || 1;
  const canvas = overview.canvas;
  canvas.width = Math.round(w * ratio);
  canvas.height = Math.round(h * ratio);
  canvas.style.width = w + "px";
  canvas.style.height = h + "px";
  const ctx = canvas.getContext("2d");
  ctx.setTransform(ratio * k, 0, 0, ratio * k, -full[0] * ratio * k, -full[1] * ratio * k);
  for (const b of drawnBoxes(drawn.svg)) {
    if (b.cluster) {
      ctx.strokeStyle = "#999";
      ctx.lineWidth = 1 / k;
      ctx.strokeRect(b.x, b.y, b.w, b.h);
    } else {
      ctx.fillStyle = b.fill && b.fill !== "none" ? b.fill : "#fff";
      ctx.fillRect(b.x, b.y, b.w, b.h);
      ctx.strokeStyle = "#555";
      ctx.lineWidth = 0.5 / k;
      ctx.strokeRect(b.x, b.y, b.w, b.h);
    }
  }
  moveOverviewBox();
}

// The "you are here" box: the part of the graph the main view shows.
function moveOverviewBox() {
  const full = overview.full, view = state.view;
  if (!full || !view || overview.el.hidden) return;
  const k = overview.k, w = overview.canvas.clientWidth, h = overview.canvas.clientHeight;
  const left = Math.max(0, (view[0] - full[0]) * k), top = Math.max(0, (view[1] - full[1]) * k);
  const right = Math.min(w, (view[0] + view[2] - full[0]) * k);
  const bottom = Math.min(h, (view[1] + view[3] - full[1]) * k);
  Object.assign(overview.box.style, { left: left + "px", top: top + "px",
    width: Math.max(4, right - left) + "px", height: Math.max(4, bottom - top) + "px" });
}

// Centre the main view on the point of the inset under the pointer.
function moveToOverviewPoint(ev) {
  const rect = overview.canvas.getBoundingClientRect(), view = state.view;
  if (!view || !overview.full) return;
  const x = overview.full[0] + (ev.clientX - rect.left) / overview.k;
  const y = overview.full[1] + (ev.clientY - rect.top) / overview.k;
  setView([x - view[2] / 2, y - view[3] / 2, view[2], view[3]]);
}

function installOverview() {
  let dragging = false;
  overview.el.addEventListener("mousedown", (ev) => {
    ev.stopPropagation();  // not a pan of the main view
    ev.preventDefault();
    dragging = true;
    moveToOverviewPoint(ev);
  });
  window.addEventListener("mousemove", (ev) => { if (dragging) moveToOverviewPoint(ev); });
  window.addEventListener("mouseup", () => { dragging = false; });
  overview.el.addEventListener("click", (ev) => ev.stopPropagation());
  ui.graph.addEventListener("mouseover", (ev) => {
    const g = ev.target.closest("g.node, g.cluster");
    if (g && g.dataset.key) showPath(g.dataset.key);
  });
  ui.graph.addEventListener("mouseleave", () => showPath(state.selected));
  ui.breadcrumb.addEventListener("mousedown", (ev) => ev.stopPropagation());
  ui.breadcrumb.addEventListener("click", (ev) => {
    ev.stopPropagation();
    const a = ev.target.closest("a");
    if (a && a.dataset.gotoModule) goToModule(a.dataset.gotoModule);
  });
}

// ----- the breadcrumb --------------------------------------------------------------------------
// The modules around a drawn node (a node key or a module key), outermost first.
function pathOf(key) {
  if (!key) return [];
  if (key === FAILED_KEY) return [];
  const isModule = key.startsWith(MODULE_PREFIX);
  const moduleKey = isModule ? key.slice(MODULE_PREFIX.length) : key;
  if (isModule || moduleDepth[state.mode].has(moduleKey)) {
    const chain = moduleChains[state.mode].get(moduleKey) || [moduleKey];
    return chain.slice(0, -1);
  }
  const pass = passByLabel.get(key) || (layerByLabel.has(key) && passByLabel.get(layerByLabel.get(key).passes[0]));
  return pass ? chains[state.mode].get(pass.label) : [];
}

function moduleName(moduleKey) {
  const [address, call] = splitModuleKey(moduleKey);
  const module = DATA.modules[address];
  return call !== null && module && module.calls > 1 ? `${address} (call ${call})` : address;
}

function showPath(key) {
  if (!key) { ui.breadcrumb.textContent = DATA.model; return; }
  const leaf = key.startsWith(MODULE_PREFIX) ? moduleName(key.slice(MODULE_PREFIX.length))
    : moduleDepth[state.mode].has(key) ? moduleName(key) : key === FAILED_KEY ? "forward pass failed" : key;
  const parts = [esc(DATA.model), ...pathOf(key).map((m) => `<a data-goto-module="${esc(m)}">${esc(moduleName(m))}</a>`),
    `<b>${esc(leaf)}</b>`];
  ui.breadcrumb.innerHTML = parts.join(" \u203A ");
}
