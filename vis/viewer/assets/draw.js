// Drawing: DOT text for the current state, laid out by Graphviz (WebAssembly) into SVG,
// tagged for tests and scripts (data-label; data-module, the module address, with data-call in
// the unrolled view); pan, zoom and centring.
// ----- DOT text ------------------------------------------------------------------------
function quote(text) {
  return '"' + String(text).replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n") + '"';
}

function attrs(obj) {
  const parts = Object.entries(obj).filter(([, v]) => v !== "" && v !== undefined)
    .map(([k, v]) => k + "=" + quote(v));
  return parts.length ? " [" + parts.join(", ") + "]" : "";
}

const PLUMBING_STYLE = { fillcolor: "#EEEEEE", color: "#777777" };
// A collapsed module holding an intervened pass: the intervened kind's outline, drawn thick.
const INTERVENED_OUTLINE = { color: DATA.dot.kinds.intervened.color, penwidth: "3" };

function boxTitle(moduleKey) {
  const entry = scopeEntry(moduleKey);
  const chain = moduleChains[state.mode].get(moduleKey) || [];
  return "\u229F " + (entry ? withoutPrefix(entry.lines[0], chain[chain.length - 2]) : moduleKey);  // a boxed minus: click to collapse
}

// A module's title inside the box of `parentKey`, without the address prefix that box shows.
function withoutPrefix(title, parentKey) {
  if (!parentKey) return title;
  const parent = splitModuleKey(parentKey)[0] + ".";
  return title.startsWith(parent) ? title.slice(parent.length) : title;
}

function buildDot(placed, edgeList) {
  const ids = new Map();  // DOT/SVG id -> {key, type: node|box}
  const boxChildren = new Map([[null, { nodes: [], boxes: [] }]]);
  const boxId = new Map();
  for (const unit of placed.units.values()) {
    let parent = null;
    unit.boxes.forEach((box) => {
      if (!boxChildren.has(box)) {
        boxChildren.set(box, { nodes: [], boxes: [] });
        boxChildren.get(parent).boxes.push(box);
        boxId.set(box, "c" + boxId.size);
        ids.set(boxId.get(box), { key: box, type: "box" });
      }
      parent = box;
    });
    boxChildren.get(parent).nodes.push(unit);
  }
  const nodeId = new Map();
  const lines = ["digraph torchlog {"];
  const graph = { rankdir: state.direction, ...DATA.dot.graph };
  if (placed.units.size > DATA.dot.largeNodes) Object.assign(graph, DATA.dot.large);
  lines.push("graph" + attrs(graph), "node" + attrs(DATA.dot.node), "edge" + attrs(DATA.dot.edge));
  const writeBox = (box, depth) => {
    const content = boxChildren.get(box);
    for (const unit of content.nodes) {
      const id = "n" + nodeId.size;
      nodeId.set(unit.key, id);
      ids.set(id, { key: unit.key, type: "node", unit });
      const style = { ...DATA.dot.kinds[unit.kind === "repeat" ? "module" : unit.kind] };
      if (unit.kind === "module" && isPlumbing(unit.key.slice(MODULE_PREFIX.length))) Object.assign(style, PLUMBING_STYLE);
      if (unit.kind === "module" && intervenedPasses(unit)) Object.assign(style, INTERVENED_OUTLINE);
      if (unit.kind !== "module" && unit.members[0] && unit.members[0].inplace) Object.assign(style, DATA.dot.inplace);
      lines.push(quote(unit.key) + attrs({ id, label: nodeLines(unit).join("\n"), ...style }));
    }
    for (const child of content.boxes) {
      lines.push("subgraph " + quote("cluster_" + child) + " {");
      lines.push("graph" + attrs({ id: boxId.get(child), label: boxTitle(child), style: "rounded",
        penwidth: Math.max(1, 3 - 0.5 * (depth + 1)).toFixed(1), fontsize: "10", labeljust: "l",
        labelloc: state.direction === "BT" ? "b" : "t" }));
      writeBox(child, depth + 1);
      lines.push("}");
    }
  };
  writeBox(null, 0);
  edgeList.forEach((e, i) => lines.push(quote(e.tail) + " -> " + quote(e.head) + attrs({ id: "e" + i, ...e.attrs })));
  lines.push("}");
  return { dot: lines.join("\n"), ids, nodeId, boxId };
}

// ----- drawing ---------------------------------------------------------------------------
let graphviz = null;

let renderTicket = 0;

// Lay out and draw the current state. A layout that fails or is cancelled leaves the page as
// it was drawn (the state goes back to the drawn one) and says so; nothing is thrown.
async function render(reason) {
  const started = performance.now();
  const ticket = ++renderTicket;
  const placed = placement();
  const { kept: edgeList, folded } = foldFans(edges(placed), placed);
  if (placed.units.size > MAX_DRAWN && !state.forceDraw) {
    tooLarge(placed.units.size);
    return;
  }
  const built = buildDot(placed, edgeList);
  let svgText;
  const laying = performance.now();
  try {
    svgText = await layoutSvg(built.dot, placed.units.size);
  } catch (err) {
    if (ticket === renderTicket) notDrawn(err, placed.units.size, reason);
    return;
  }
  if (ticket !== renderTicket) return;  // a newer render replaced this one
  const layoutMs = performance.now() - laying;
  ui.drawing.innerHTML = svgText;
  const svg = ui.drawing.querySelector("svg");
  svg.removeAttribute("width");
  svg.removeAttribute("height");
  annotate(svg, built);
  const titleUnits = prepareTitles(svg, built);
  state.drawn = { placed, built, svg, edges: edgeList, titleUnits, folded, state: drawnState() };
  drawMarkers(svg, built, folded);
  applyColours();
  drawOverview();
  const ms = performance.now() - started;
  timings.push({ reason: reason || "render", ms, nodes: placed.units.size, edges: edgeList.length,
    worker: layouts.inWorker, layoutMs });
  document.body.dataset.renders = String(timings.length);
  state.drawnStatus = `${placed.units.size} nodes, ${edgeList.length} edges, ${state.mode}; drawn in ${ms.toFixed(0)} ms`;
  setStatus(state.drawnStatus);
  syncControls();
}

// What a drawing was drawn from, to go back to when a later layout does not finish.
function drawnState() {
  return { mode: state.mode, depth: state.depth, expanded: new Set(state.expanded), direction: state.direction,
    showBuffers: state.showBuffers, showPlumbing: state.showPlumbing, forceDraw: state.forceDraw,
    foldRepeats: state.foldRepeats, unfoldedRuns: new Set(state.unfoldedRuns) };
}

function notDrawn(err, count, reason) {
  const cancelled = err instanceof LayoutCancelled;
  const previous = state.drawn && state.drawn.state;
  if (previous) {
    Object.assign(state, { ...previous, expanded: new Set(previous.expanded), unfoldedRuns: new Set(previous.unfoldedRuns) });
  }
  if (!state.drawn) {
    ui.drawing.innerHTML = `<div class="message"><p><b>${count} nodes</b> could not be laid out: ${esc(err.message)}.</p>` +
      "<p>Collapse more modules (a smaller depth) or switch to the rolled view.</p></div>";
  }
  timings.push({ reason: (cancelled ? "cancelled " : "failed ") + (reason || "render"), ms: 0, nodes: count, edges: 0 });
  document.body.dataset.renders = String(timings.length);
  setStatus(cancelled ? "layout cancelled: the view is as it was" :
    `layout of ${count} nodes failed: ${err.message} (collapse more modules or switch view)`, true);
  syncControls();
}

function tooLarge(count) {
  const offer = count <= MAX_FORCED ? ` or <button type="button" id="torchlog-draw-anyway">draw anyway</button>` :
    `; above ${MAX_FORCED} nodes it is not offered, as Graphviz runs out of stack on such graphs`;
  ui.drawing.innerHTML = `<div class="message"><p><b>${count} nodes</b> at this depth: laying out more than
    ${MAX_DRAWN} nodes takes long and may fail.</p><p>Collapse more modules (a smaller depth), switch to
    the rolled view${offer}.</p></div>`;
  const button = el("torchlog-draw-anyway");
  if (button) button.onclick = () => { state.forceDraw = true; render("draw anyway"); };
  state.drawn = null;
  drawOverview();
  timings.push({ reason: "too large", ms: 0, nodes: count, edges: 0 });
  document.body.dataset.renders = String(timings.length);
  setStatus(`${count} nodes: not drawn`, true);
  syncControls();
}

// A folded edge's marker: a tab on the head node's top-left corner naming the value it reads
// (click: go to that value's node).
function drawMarkers(svg, built, folded) {
  const layer = svg.querySelector("g.graph");
  const placedOn = new Map();
  for (const { tail, head } of folded) {
    const node = svg.getElementById(built.nodeId.get(head));
    const shape = node && node.querySelector(":scope > polygon, :scope > ellipse, :scope > path");
    const bounds = shape && shapeBounds(shape);
    if (!bounds) continue;
    const text = "\u25B8 " + shortTitle(built.ids.get(built.nodeId.get(tail)));
    const offset = placedOn.get(head) || 0;
    const width = 4 + 4.2 * text.length;
    const g = document.createElementNS(SVG_NS, "g");
    g.setAttribute("class", "torchlog-marker");
    g.dataset.from = tail;
    g.dataset.to = head;
    const title = document.createElementNS(SVG_NS, "title");
    title.textContent = "reads " + tail.replace(MODULE_PREFIX, "") + " (edge folded: click to go there)";
    const rect = document.createElementNS(SVG_NS, "rect");
    Object.entries({ x: bounds.x + offset, y: bounds.y - 9, width, height: 9, rx: 2 })
      .forEach(([k, v]) => rect.setAttribute(k, typeof v === "number" ? v.toFixed(1) : v));
    const label = document.createElementNS(SVG_NS, "text");
    Object.entries({ x: bounds.x + offset + 2, y: bounds.y - 2, "font-size": 7 })
      .forEach(([k, v]) => label.setAttribute(k, typeof v === "number" ? v.toFixed(1) : v));
    label.textContent = text;
    g.append(title, rect, label);
    layer.appendChild(g);
    placedOn.set(head, offset + width + 2);
  }
}

// Tag the SVG so tests and scripts find nodes by label and boxes by module address.
function annotate(svg, built) {
  for (const g of svg.querySelectorAll("g.node, g.cluster")) {
    const info = built.ids.get(g.id);
    if (!info) continue;
    if (info.type === "box" || info.unit.kind === "module") {
      const [address, call] = splitModuleKey(info.type === "box" ? info.key : info.key.slice(MODULE_PREFIX.length));
      g.dataset.module = address;
      if (call !== null) g.dataset.call = String(call);
      g.dataset.expanded = String(info.type === "box");
      const moduleKey = info.type === "box" ? info.key : info.key.slice(MODULE_PREFIX.length);
      if (isPlumbing(moduleKey)) g.dataset.plumbing = scopeEntry(moduleKey).kind;
      if (info.type === "node" && intervenedPasses(info.unit)) g.dataset.intervened = String(intervenedPasses(info.unit));
    } else if (info.unit.kind === "failed") {
      g.dataset.failed = "true";
    } else if (info.unit.kind === "repeat") {
      g.dataset.repeat = info.unit.run.map((k) => splitModuleKey(k)[0]).join(" ");
    } else {
      g.dataset.label = state.mode === "rolled" ? info.unit.members[0].layer : info.key;
    }
    g.dataset.key = info.key;
  }
  const sel = state.selected && built.nodeId.get(state.selected);
  if (sel) svg.getElementById(sel).classList.add("torchlog-selected");
  state.view = null;
}

function setStatus(text, isError) {
  ui.status.textContent = text;
  ui.status.title = text;  // the whole message, where the fixed-width line cuts it
  ui.status.classList.toggle("error", Boolean(isError));
}

function syncControls() {
  ui.mode.value = state.mode;
  ui.depth.value = String(state.depth);
  ui.depth.max = String(maxDepth + 1);
  ui.direction.value = state.direction;
  ui.buffers.checked = state.showBuffers;
  ui.plumbing.checked = state.showPlumbing;
  ui.repeats.checked = state.foldRepeats;
}

// ----- pan and zoom (the SVG viewBox) -------------------------------------------------------
function graphBox(svg) {
  const box = svg.viewBox.baseVal;
  return [box.x, box.y, box.width, box.height];
}

function setView(view) {
  const svg = state.drawn && state.drawn.svg;
  if (!svg) return;
  state.view = view;
  state.pendingFit = false;
  svg.setAttribute("viewBox", view.map((v) => v.toFixed(2)).join(" "));
  showDetail(ui.graph.getBoundingClientRect().width / view[2]);
  moveOverviewBox();
}

// The graph area's size, or null while it has none (a background tab, a collapsed output):
// a fit then waits for one (installControls' ResizeObserver) rather than computing NaN.
function graphArea() {
  const rect = ui.graph.getBoundingClientRect();
  return rect.width > 0 && rect.height > 0 ? rect : null;
}

// The scale at which the whole graph fits below the breadcrumb (never above 1.5x).
function fitScale() {
  const svg = state.drawn && state.drawn.svg, rect = graphArea();
  if (!svg || !rect) return null;
  const full = state.drawn.full || (state.drawn.full = graphBox(svg));
  return Math.min(rect.width / full[2], (rect.height - ui.breadcrumb.offsetHeight) / full[3], 1.5);
}

// The smallest scale at which every module's title is OPEN_TITLE_PX (none: any scale).
function readableScale() {
  const units = state.drawn && state.drawn.titleUnits;
  return units && Number.isFinite(units) ? OPEN_TITLE_PX / units : 0;
}

// Show the whole graph, centred below the breadcrumb (the Fit button).
function fit() {
  const scale = fitScale();
  if (scale === null) { state.pendingFit = true; return null; }
  const full = state.drawn.full, rect = graphArea(), top = ui.breadcrumb.offsetHeight;
  const w = rect.width / scale, h = rect.height / scale;
  const middle = full[1] + full[3] / 2;  // drawn halfway between the breadcrumb and the bottom
  setView([full[0] - (w - full[2]) / 2, middle - (rect.height + top) / (2 * scale), w, h]);
  return scale;
}

// The view the page picks itself: the whole graph where its module titles stay readable,
// else the start of the graph (its top, or left when drawn left to right) at the scale
// that keeps them readable; the rest is a scroll (drag) away.
function fitReadable() {
  const scale = fitScale();
  if (scale === null) { state.pendingFit = true; return null; }
  const need = Math.min(1.5, readableScale());
  if (scale >= need) return fit();
  const full = state.drawn.full, rect = graphArea(), top = ui.breadcrumb.offsetHeight;
  const w = rect.width / need, h = rect.height / need;
  const across = state.direction === "LR";
  const x = across || full[2] > w ? full[0] - 8 / need : full[0] - (w - full[2]) / 2;
  const y = !across || full[3] > h - top / need ? full[1] - (top + 8) / need : full[1] - (h - full[3]) / 2;
  setView([x, y, w, h]);
  return need;
}

function zoomAt(clientX, clientY, factor) {
  const view = state.view;
  if (!view) return;
  const rect = ui.graph.getBoundingClientRect();
  const fx = (clientX - rect.left) / rect.width, fy = (clientY - rect.top) / rect.height;
  const w = view[2] * factor, h = view[3] * factor;
  setView([view[0] + (view[2] - w) * fx, view[1] + (view[3] - h) * fy, w, h]);
}

// Zoom about the middle of the graph area: `factor` 2 shows things twice as large.
function zoomBy(factor) {
  const rect = ui.graph.getBoundingClientRect();
  zoomAt(rect.left + rect.width / 2, rect.top + rect.height / 2, 1 / factor);
}

function centerOn(element) {
  const svg = state.drawn && state.drawn.svg;
  if (!svg || !element) return;
  const box = element.getBBox();
  const ctm = element.getCTM(), root = svg.getCTM();
  // getBBox is in the element's own user space; map its centre into the SVG's viewBox space.
  const point = svg.createSVGPoint();
  point.x = box.x + box.width / 2;
  point.y = box.y + box.height / 2;
  const centre = point.matrixTransform(root.inverse().multiply(ctm));
  const rect = graphArea();
  if (!rect) return;
  const scale = Math.max(0.6, Math.min(1.2, rect.width / (box.width * 3), rect.height / (box.height * 3)));
  const w = rect.width / scale, h = rect.height / scale;
  setView([centre.x - w / 2, centre.y - h / 2, w, h]);
}

function installPanZoom() {
  let drag = null;
  ui.graph.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    zoomAt(ev.clientX, ev.clientY, Math.exp(ev.deltaY * 0.0015));
  }, { passive: false });
  ui.graph.addEventListener("mousedown", (ev) => {
    if (ev.button !== 0 || !state.view) return;
    drag = { x: ev.clientX, y: ev.clientY, view: state.view.slice(), moved: false };
  });
  window.addEventListener("mousemove", (ev) => {
    if (!drag) return;
    const dx = ev.clientX - drag.x, dy = ev.clientY - drag.y;
    if (Math.abs(dx) + Math.abs(dy) > 3) { drag.moved = true; ui.graph.classList.add("dragging"); }
    const rect = ui.graph.getBoundingClientRect();
    const k = drag.view[2] / rect.width;
    setView([drag.view[0] - dx * k, drag.view[1] - dy * k, drag.view[2], drag.view[3]]);
  });
  window.addEventListener("mouseup", () => {
    if (drag && drag.moved) ui.graph.dataset.justDragged = "1";
    drag = null;
    ui.graph.classList.remove("dragging");
  });
}
