// Stable expands: opening or closing a module keeps the zoom and keeps that module where it
// was on screen (the box's title where the collapsed node was, and back), and every other
// node that the new layout moved glides from its old place to its new one.
const GLIDE_MS = 250;

// Screen rectangles of the drawn nodes and boxes, by key.
function screenPlaces() {
  const places = new Map();
  const svg = state.drawn && state.drawn.svg;
  if (!svg) return places;
  for (const g of svg.querySelectorAll("g.node[data-key], g.cluster[data-key]")) {
    places.set(g.dataset.key, g.getBoundingClientRect());
  }
  return places;
}

function currentScale() {
  return state.view ? ui.graph.getBoundingClientRect().width / state.view[2] : null;
}

// Where `element` is in the SVG's viewBox units.
function viewBoxRect(element) {
  const svg = state.drawn.svg;
  const b = element.getBBox();
  const m = svg.getCTM().inverse().multiply(element.getCTM());
  const p = svg.createSVGPoint();
  p.x = b.x; p.y = b.y;
  const corner = p.matrixTransform(m);
  return { x: corner.x, y: corner.y, w: b.width * m.a, h: b.height * m.d };
}

// After a redraw, show the module's element (box or node) at the top-left corner `anchor`
// had on screen, at `scale` (the picture stays put); only a title that would be off screen
// pulls the view.
function keepInPlace(moduleKey, anchor, scale) {
  const target = moduleElement(moduleKey);
  const rect = ui.graph.getBoundingClientRect();
  if (!target || !anchor || !scale) { fit(); if (target) centerOn(target); return; }
  const box = viewBoxRect(target);
  const top = ui.breadcrumb.offsetHeight;
  let left = anchor.left - rect.left, up = anchor.top - rect.top;
  left = Math.min(left, rect.width - 60);
  up = Math.min(up, rect.height - 40);
  left = Math.max(left, 8);
  up = Math.max(up, top + 4);  // the title never goes under the breadcrumb or off the top
  const w = rect.width / scale, h = rect.height / scale;
  setView([box.x - left / scale, box.y - up / scale, w, h]);
}

// Nodes drawn before and after that moved on screen start where they were and glide over.
function glideFrom(before, skip) {
  const scale = currentScale();
  let glides = 0;
  if (!scale || !Element.prototype.animate) return glides;
  for (const [key, old] of before) {
    if (skip(key)) continue;
    const g = state.drawn.svg.querySelector(`[data-key="${cssEscape(key)}"]`);
    if (!g) continue;
    const now = g.getBoundingClientRect();
    const dx = (old.left + old.width / 2 - now.left - now.width / 2) / scale;
    const dy = (old.top + old.height / 2 - now.top - now.height / 2) / scale;
    if (Math.abs(dx) + Math.abs(dy) < 0.5) continue;
    g.animate([{ transform: `translate(${dx}px, ${dy}px)` }, { transform: "translate(0px, 0px)" }],
      { duration: GLIDE_MS, easing: "ease-out" });
    glides += 1;
  }
  for (const edge of state.drawn.svg.querySelectorAll("g.edge")) {
    edge.animate([{ opacity: 0 }, { opacity: 1 }], { duration: GLIDE_MS, easing: "ease-in" });
  }
  return glides;
}

// Is `key` (a node or box key) the module `moduleKey` itself or something inside it?
function insideModule(key, moduleKey) {
  const bare = key.startsWith(MODULE_PREFIX) ? key.slice(MODULE_PREFIX.length) : key;
  if (bare === moduleKey) return true;
  const chain = moduleChains[state.mode].get(bare) || chains[state.mode].get(bare) ||
    (layerByLabel.has(bare) && chains[state.mode].get(layerByLabel.get(bare).passes[0]));
  return Boolean(chain) && chain.includes(moduleKey);
}

// ----- pinned expands: the picture around a module stays put ---------------------------------
// Opening (or closing) a module lays the graph out again, and Graphviz may move everything. The
// new drawing is then moved back onto the old one: the module's box takes the corner its node
// had; what was before it along the flow stays where it was; what was after it moves by how
// much longer the module got, and what was beside it (after it across the flow) by how much
// wider; boxes around it stretch to hold it; edges between things that moved apart are drawn
// again as plain curves.

// Rectangles (viewBox units) of the drawn nodes and boxes, by key.
function drawnRects() {
  const rects = new Map();
  const svg = state.drawn && state.drawn.svg;
  if (!svg || !state.view) return rects;
  for (const g of svg.querySelectorAll("g.node[data-key], g.cluster[data-key]")) rects.set(g.dataset.key, viewBoxRect(g));
  return rects;
}

// How far an element that was at `b` moves, given the module was at `was` and grew by
// `grow` along the flow and `widen` across it.
function pinOffset(b, was, grow, widen, across) {
  const [start, size, side, width] = across ? ["x", "w", "y", "h"] : ["y", "h", "x", "w"];
  const move = (along, aside) => (across ? { x: along, y: aside } : { x: aside, y: along });
  if (b[start] >= was[start] + was[size] - 0.5) return move(grow, 0);        // after it
  if (b[start] + b[size] <= was[start] + 0.5) return move(0, 0);              // before it
  return b[side] + b[width] / 2 > was[side] + was[width] / 2 ? move(0, widen) : move(0, 0);  // beside it
}

function graphMatrix(svg) {
  const t = svg.querySelector("g.graph").transform.baseVal.consolidate();
  return t ? t.matrix : { a: 1, d: 1, e: 0, f: 0 };
}

function translate(g, d, m) {
  if (Math.abs(d.x) + Math.abs(d.y) < 0.01) return;
  g.setAttribute("transform", `translate(${(d.x / m.a).toFixed(2)} ${(d.y / m.d).toFixed(2)})`);
}

// Move the new drawing onto `old` (rects by key before the redraw); false where it cannot.
function pinAround(moduleKey, old, opening) {
  const svg = state.drawn && state.drawn.svg;
  const newKey = opening ? moduleKey : MODULE_PREFIX + moduleKey;
  const was = old.get(opening ? MODULE_PREFIX + moduleKey : moduleKey);
  const target = svg && svg.querySelector(`[data-key="${cssEscape(newKey)}"]`);
  if (!was || !target || state.direction === "BT") return false;
  const m = graphMatrix(svg), now = viewBoxRect(target), across = state.direction === "LR";
  const grow = across ? now.w - was.w : now.h - was.h, widen = across ? now.h - was.h : now.w - was.w;
  const shift = { x: was.x - now.x, y: was.y - now.y };
  const deltas = new Map(), ancestors = [];
  for (const g of svg.querySelectorAll("g.node[data-key], g.cluster[data-key]")) {
    const key = g.dataset.key, before = old.get(key);
    if (g.classList.contains("cluster") && key !== newKey && insideModule(newKey, key)) { ancestors.push(g); continue; }
    let d = shift;
    if (!insideModule(key, moduleKey) && before) {
      const off = pinOffset(before, was, grow, widen, across), here = viewBoxRect(g);
      d = { x: before.x + off.x - here.x, y: before.y + off.y - here.y };
    }
    deltas.set(key, d);
    translate(g, d, m);
  }
  stretchBoxes(ancestors, old, m);
  redrawEdges(svg, deltas, m, across);
  for (const marker of svg.querySelectorAll("g.torchlog-marker")) translate(marker, deltas.get(marker.dataset.to) || shift, m);
  const all = [...svg.querySelectorAll("g.node[data-key], g.cluster[data-key]")].map(viewBoxRect);
  const x = Math.min(...all.map((r) => r.x)) - 4, y = Math.min(...all.map((r) => r.y)) - 4;
  state.drawn.full = [x, y, Math.max(...all.map((r) => r.x + r.w)) + 4 - x, Math.max(...all.map((r) => r.y + r.h)) + 4 - y];
  return true;
}

// Boxes around the module: each keeps its corner and grows to hold what it holds, deepest first.
function stretchBoxes(ancestors, old, m) {
  const depthOf = (g) => (moduleChains[state.mode].get(g.dataset.key) || []).length;
  for (const g of ancestors.sort((a, b) => depthOf(b) - depthOf(a))) {
    const key = g.dataset.key, before = old.get(key) || viewBoxRect(g);
    const shape = g.querySelector(":scope > path, :scope > polygon");
    const inner = [...state.drawn.svg.querySelectorAll("g.node[data-key], g.cluster[data-key]")]
      .filter((h) => h !== g && insideModule(h.dataset.key, key)).map(viewBoxRect);
    if (!shape || !inner.length) continue;
    const here = viewBoxRect(g);
    const right = Math.max(before.x + before.w, ...inner.map((r) => r.x + r.w + 8));
    const bottom = Math.max(before.y + before.h, ...inner.map((r) => r.y + r.h + 8));
    const [x0, y0, x1, y1] = [(before.x - m.e) / m.a, (before.y - m.f) / m.d, (right - m.e) / m.a, (bottom - m.f) / m.d];
    if (shape.tagName === "polygon") shape.setAttribute("points", `${x0},${y0} ${x1},${y0} ${x1},${y1} ${x0},${y1} ${x0},${y0}`);
    else shape.setAttribute("d", `M${x0 + 4},${y0}L${x1 - 4},${y0}Q${x1},${y0} ${x1},${y0 + 4}L${x1},${y1 - 4}` +
      `Q${x1},${y1} ${x1 - 4},${y1}L${x0 + 4},${y1}Q${x0},${y1} ${x0},${y1 - 4}L${x0},${y0 + 4}Q${x0},${y0} ${x0 + 4},${y0}Z`);
    const d = { x: before.x - here.x, y: before.y - here.y };
    g.querySelectorAll(":scope > text").forEach((t) => translate(t, d, m));
  }
}

// Edges whose two ends moved alike move with them; the others are drawn again as a curve from
// the tail's side to the head's, with their arrowhead and label.
function redrawEdges(svg, deltas, m, across) {
  const rect = (key) => { const g = svg.querySelector(`[data-key="${cssEscape(key)}"]`); return g && viewBoxRect(g); };
  state.drawn.edges.forEach((edge, i) => {
    const g = svg.getElementById("e" + i), dt = deltas.get(edge.tail), dh = deltas.get(edge.head);
    if (!g || !dt || !dh) return;
    if (Math.abs(dt.x - dh.x) + Math.abs(dt.y - dh.y) < 0.01) { translate(g, dt, m); return; }
    const [a, b] = [rect(edge.tail), rect(edge.head)];
    const path = g.querySelector("path"), head = g.querySelector("polygon");
    if (!a || !b || !path) return;
    const toGraph = (x, y) => [(x - m.e) / m.a, (y - m.f) / m.d];
    const [x1, y1] = toGraph(across ? a.x + a.w : a.x + a.w / 2, across ? a.y + a.h / 2 : a.y + a.h);
    const [x2, y2] = toGraph(across ? b.x : b.x + b.w / 2, across ? b.y + b.h / 2 : b.y);
    const [ux, uy] = across ? [1, 0] : [0, 1];
    const [ex, ey] = [x2 - 8 * ux, y2 - 8 * uy], bend = 0.4 * (across ? ex - x1 : ey - y1);
    path.setAttribute("d", `M${x1},${y1}C${x1 + bend * ux},${y1 + bend * uy} ${ex - bend * ux},${ey - bend * uy} ${ex},${ey}`);
    if (head) head.setAttribute("points", `${x2},${y2} ${ex - 3 * uy},${ey - 3 * ux} ${ex + 3 * uy},${ey + 3 * ux} ${x2},${y2}`);
    const label = g.querySelector("text");
    if (label) {
      const d = { x: ((x1 + ex) / 2 + 4 - Number(label.getAttribute("x"))) * m.a, y: ((y1 + ey) / 2 - Number(label.getAttribute("y"))) * m.d };
      g.querySelectorAll("text").forEach((t) => translate(t, d, m));
    }
  });
}
