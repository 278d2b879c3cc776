// Finding your way: an inset map of the whole graph with a "you are here" box, text hidden
// rather than drawn too small to read, and the module path of what the pointer is on (or of
// the selection) in a breadcrumb above the graph.
const OVERVIEW_SIDE = 180;  // px, the inset's longer side
// On-screen size (px) below which text is hidden: edge labels are drawn at 8 and node text at
// 10. Zoomed out past FULL_TEXT_PX, every node and box shows one short title instead (a module's own
// name, `h.5`, without the prefix its box shows; an op's function), as large as its node
// allows (a size of SHORT_SIZES), with a halo where it crosses a box's content.
const READABLE_PX = 6.5;
// Node and box text (10 units) is drawn whole from this size (px) up: about 8.5 px of screen
// for a line, the height module titles keep on a view the page picks itself.
const FULL_TEXT_PX = 7.5;
// The first view, and any fit the page chooses itself, shows module titles at least this large
// (px): a shallower depth, else the top of the graph at this size, scrolled.
const OPEN_TITLE_PX = 8;
const SHORT_SIZES = [6, 8, 10, 12, 15, 20, 25, 30, 40];
const SVG_NS = "http://www.w3.org/2000/svg";
const overview = { el: el("torchlog-overview"), box: el("torchlog-overview-view"), k: 1, full: null };
overview.canvas = overview.el.querySelector("canvas");

// ----- level of detail ------------------------------------------------------------------------

function showDetail(scale) {
  const classes = ui.graph.classList;
  classes.toggle("torchlog-no-edge-text", 8 * scale < READABLE_PX);
  const compact = 10 * scale < FULL_TEXT_PX;
  classes.toggle("torchlog-compact", compact);
  for (const size of SHORT_SIZES) classes.toggle("torchlog-hide-s" + size, compact && size * scale < READABLE_PX);
}

// A module's name as its node or box shows it: the address without the prefix of the box
// around it (`h.5` inside `transformer`), the call where the module has several.
function shortModuleName(moduleKey, parentKey) {
  const entry = scopeEntry(moduleKey);
  if (entry && (entry.kind === "helper" || entry.kind === "fold")) return entry.lines[0].split(" (")[0];
  const [address, call] = splitModuleKey(moduleKey);
  const parent = parentKey ? splitModuleKey(parentKey)[0] : "";
  const name = parent && address.startsWith(parent + ".") ? address.slice(parent.length + 1) : address;
  const module = DATA.modules[address];
  const named = /^\d+$/.test(name) && module && module.type ? `${name} ${module.type}` : name;  // a Sequential's `0`
  return call !== null && module && module.calls > 1 ? `${named}:${call}` : named;
}

function shortTitle(info) {
  if (info.type === "box") {
    const chain = moduleChains[state.mode].get(info.key) || [];
    return shortModuleName(info.key, chain[chain.length - 2]);
  }
  const unit = info.unit;
  if (unit.kind === "failed") return "raised";
  if (unit.kind === "repeat") return `${repeatName(unit)} \u00D7${unit.run.length}`;
  if (unit.kind === "module") return shortModuleName(unit.key.slice(MODULE_PREFIX.length), unit.boxes[unit.boxes.length - 1]);
  const p = unit.members[0];
  return ["input", "output", "buffer"].includes(p.kind) ? p.kind : String(p.func).replace(/^_+|_+$/g, "");
}

function shapeBounds(shape) {
  if (shape.tagName === "ellipse") {
    const [cx, cy, rx, ry] = ["cx", "cy", "rx", "ry"].map((a) => Number(shape.getAttribute(a)));
    return { x: cx - 0.8 * rx, y: cy - ry, w: 1.6 * rx, h: 2 * ry };
  }
  if (shape.tagName === "path") {
    const b = shape.getBBox();
    return b.width > 0 ? { x: b.x, y: b.y, w: b.width, h: b.height } : null;
  }
  const text = shape.getAttribute("points") || "";
  const points = text.trim().split(/\s+/).map((p) => p.split(",").map(Number)).filter((p) => p.length === 2);
  if (!points.length) return null;
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x = Math.min(...xs), y = Math.min(...ys);
  return { x, y, w: Math.max(...xs) - x, h: Math.max(...ys) - y };
}

// The largest of SHORT_SIZES at most `room` (the smallest when none is).
function shortSize(room) {
  let size = SHORT_SIZES[0];
  for (const s of SHORT_SIZES) if (s <= room) size = s;
  return size;
}

// Give each node and box its short title (shown when zoomed out); returns the smallest size
// of a module's (a node's or box's) short title, in drawing units.
function prepareTitles(svg, built) {
  let smallest = Infinity;
  for (const g of svg.querySelectorAll("g.node, g.cluster")) {
    const info = built.ids.get(g.id);
    const shape = g.querySelector(":scope > polygon, :scope > ellipse, :scope > path");
    const bounds = info && shape && shapeBounds(shape);
    if (!bounds) continue;
    const text = shortTitle(info) || "";
    const perChar = 0.6 * Math.max(1, text.length);
    const t = document.createElementNS(SVG_NS, "text");
    t.setAttribute("class", "torchlog-short");
    if (info.type === "box") {
      const size = shortSize(Math.min((0.9 * bounds.w) / perChar, 30));
      t.setAttribute("x", (bounds.x + 4).toFixed(1));
      t.setAttribute("y", (bounds.y + 2 + 0.9 * size).toFixed(1));
      t.setAttribute("font-size", String(size));
      t.dataset.size = String(size);
    } else {
      const size = shortSize(Math.min(0.62 * bounds.h, (0.9 * bounds.w) / perChar));
      t.setAttribute("x", (bounds.x + bounds.w / 2).toFixed(1));
      t.setAttribute("y", (bounds.y + bounds.h / 2 + 0.35 * size).toFixed(1));
      t.setAttribute("text-anchor", "middle");
      t.setAttribute("font-size", String(size));
      t.dataset.size = String(size);
    }
    t.textContent = text;
    g.appendChild(t);
    if (info.type === "box" || info.unit.kind === "module" || info.unit.kind === "repeat") smallest = Math.min(smallest, Number(t.dataset.size));
  }
  return smallest;
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
