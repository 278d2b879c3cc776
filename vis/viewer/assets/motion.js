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
// had on screen, at `scale`; then pull it fully on screen where it fits, title first.
function keepInPlace(moduleKey, anchor, scale) {
  const target = moduleElement(moduleKey);
  const rect = ui.graph.getBoundingClientRect();
  if (!target || !anchor || !scale) { fit(); if (target) centerOn(target); return; }
  const box = viewBoxRect(target);
  const top = ui.breadcrumb.offsetHeight;
  let left = anchor.left - rect.left, up = anchor.top - rect.top;
  const width = box.w * scale, height = box.h * scale;
  left = Math.min(left, rect.width - width - 8);
  up = Math.min(up, rect.height - height - 8);
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
