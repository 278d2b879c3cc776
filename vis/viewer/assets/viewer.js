// torchlog's interactive viewer: draws a logged forward pass with Graphviz (WebAssembly),
// lets modules expand and collapse, and shows what was recorded about each node.
// The page's data (passes, layers, module calls, statistics) is built in Python
// (torchlog/vis/viewer/data.py); this file only decides what to draw and draws it.
(function () {
  "use strict";

  const DATA = JSON.parse(document.getElementById("torchlog-data").textContent);
  const MODULE_PREFIX = "module ";  // keys of collapsed modules; labels never hold a space
  const FAILED_KEY = "failed op";
  const MAX_DRAWN = 2500;  // above this many nodes, ask before laying out (dot slows, then overflows)
  const el = (id) => document.getElementById(id);
  const ui = {
    graph: el("torchlog-graph"), panel: el("torchlog-panel"), status: el("torchlog-status"),
    mode: el("torchlog-mode"), depth: el("torchlog-depth"), search: el("torchlog-search"),
    direction: el("torchlog-direction"), buffers: el("torchlog-buffers"),
  };

  // ----- the model, indexed once ---------------------------------------------------------
  const passByLabel = new Map(DATA.passes.map((p) => [p.label, p]));
  const layerByLabel = new Map(DATA.layers.map((l) => [l.label, l]));
  const chains = {  // module keys holding each pass, outermost first
    unrolled: new Map(DATA.passes.map((p) => [p.label, p.modules.slice().reverse()])),
    rolled: new Map(DATA.passes.map((p) => [p.label,
      p.modules.slice().reverse().map((call) => call.slice(0, call.lastIndexOf(":")))])),
  };
  const moduleDepth = { unrolled: new Map(), rolled: new Map() };
  for (const mode of ["unrolled", "rolled"]) {
    for (const chain of chains[mode].values()) {
      chain.forEach((key, i) => {
        const known = moduleDepth[mode].get(key);
        if (known === undefined || i + 1 < known) moduleDepth[mode].set(key, i + 1);
      });
    }
  }
  const maxDepth = Math.max(0, ...[...moduleDepth.unrolled.values()]);

  const state = {
    mode: DATA.view.mode,
    depth: DATA.view.depth === null ? maxDepth + 1 : DATA.view.depth,
    expanded: new Set(),
    direction: "TB",
    showBuffers: false,
    selected: null,     // a node key, or a module key
    forceDraw: false,
    drawn: null,        // what the last render drew
    view: null,         // the SVG viewBox [x, y, w, h]
  };
  const timings = [];
  window.torchlogViewer = { state, timings, data: DATA, render, goTo, setDepth, setMode, toggleModule };

  function expandToDepth() {
    state.expanded = new Set();
    for (const [key, depth] of moduleDepth[state.mode]) {
      if (depth < state.depth) state.expanded.add(key);
    }
  }

  // ----- what to draw ---------------------------------------------------------------------
  // Each visible pass goes to one node: its own (or its layer's when rolled), or the node
  // of the outermost collapsed module holding it. Nodes sit in the boxes of the expanded
  // modules around them.
  function placement() {
    const rolled = state.mode === "rolled";
    const units = new Map();      // node key -> {key, kind, boxes, members}
    const unitOf = new Map();     // pass label -> node key
    const layerUnit = new Map();
    for (const p of DATA.passes) {
      if (p.kind === "buffer" && !state.showBuffers) continue;
      let key = rolled ? layerUnit.get(p.layer) : undefined;
      if (key === undefined) {
        key = unitKey(p, rolled, units);
        if (rolled) layerUnit.set(p.layer, key);
      }
      unitOf.set(p.label, key);
      units.get(key).members.push(p);
    }
    if (DATA.failure) {
      units.set(FAILED_KEY, { key: FAILED_KEY, kind: "failed", boxes: [], members: [] });
    }
    return { units, unitOf };
  }

  function unitKey(p, rolled, units) {
    const chain = chains[state.mode].get(p.label);
    let boxes = chain;
    let key = rolled ? p.layer : p.label;
    let kind = p.kind;
    for (let i = 0; i < chain.length; i++) {
      if (!state.expanded.has(chain[i])) {
        boxes = chain.slice(0, i);
        key = MODULE_PREFIX + chain[i];
        kind = "module";
        break;
      }
    }
    if (!units.has(key)) units.set(key, { key, kind, boxes, members: [] });
    return key;
  }

  function nodeLines(unit) {
    if (unit.kind === "failed") return DATA.failure.lines;
    if (unit.kind === "module") {
      const moduleKey = unit.key.slice(MODULE_PREFIX.length);
      const entry = state.mode === "rolled" ? DATA.modules[moduleKey] : DATA.calls[moduleKey];
      const lines = entry ? entry.lines.slice() : [moduleKey];
      lines[0] = "\u229E " + lines[0];  // a boxed plus: click to expand
      return lines;
    }
    const first = unit.members[0];
    return state.mode === "rolled" ? layerByLabel.get(first.layer).lines : first.lines;
  }

  function edges(placed) {
    const found = new Map();
    const add = (tail, head, attrs) => {
      if (tail === undefined || head === undefined || tail === head) return;
      const id = [tail, head, attrs.label || "", attrs.taillabel || "", attrs.headlabel || ""].join("\u0001");
      if (!found.has(id)) found.set(id, { tail, head, attrs });
    };
    if (state.mode === "rolled") rolledEdges(placed, add); else unrolledEdges(placed, add);
    if (DATA.failure) {
      for (const label of DATA.failure.parents) {
        const parent = passByLabel.get(label);
        if (parent) add(placed.unitOf.get(label), FAILED_KEY, { label: shapeText(parent.shape) });
      }
    }
    return [...found.values()];
  }

  function unrolledEdges(placed, add) {
    for (const p of DATA.passes) {
      const head = placed.unitOf.get(p.label);
      if (head === undefined) continue;
      const withArg = p.showArg && !head.startsWith(MODULE_PREFIX);
      for (const [parentLabel, arg] of p.parents) {
        const parent = passByLabel.get(parentLabel);
        const text = shapeText(parent.shape) + (withArg && arg ? "\n" + arg : "");
        add(placed.unitOf.get(parentLabel), head, { label: text });
      }
    }
  }

  function rolledEdges(placed, add) {
    for (const layer of DATA.layers) {
      const head = layerUnitOf(layer, placed);
      if (head === undefined) continue;
      for (const link of layer.parents) {
        const parent = layerByLabel.get(link.layer);
        const tail = parent && layerUnitOf(parent, placed);
        if (tail === undefined) continue;
        const shape = shapeText(passByLabel.get(parent.passes[0]).shape);
        if (tail.startsWith(MODULE_PREFIX) || head.startsWith(MODULE_PREFIX)) {
          add(tail, head, { label: shape });
          continue;
        }
        const spans = {
          taillabel: link.out === allPasses(parent) ? "" : "Out " + link.out,
          headlabel: link.in === allPasses(layer) ? "" : "In " + link.in,
        };
        const showArg = passByLabel.get(layer.passes[0]).showArg;
        const args = showArg && link.args.length ? link.args : [""];
        for (const arg of args) add(tail, head, { label: shape + (arg ? "\n" + arg : ""), ...spans });
      }
    }
  }

  function layerUnitOf(layer, placed) {
    for (const label of layer.passes) {
      const key = placed.unitOf.get(label);
      if (key !== undefined) return key;
    }
    return undefined;
  }

  function allPasses(layer) {
    return layer.passes.length > 1 ? "1-" + layer.passes.length : "1";
  }

  // ----- DOT text ------------------------------------------------------------------------
  function quote(text) {
    return '"' + String(text).replace(/\\/g, "\\\\").replace(/"/g, '\\"').replace(/\n/g, "\\n") + '"';
  }

  function attrs(obj) {
    const parts = Object.entries(obj).filter(([, v]) => v !== "" && v !== undefined)
      .map(([k, v]) => k + "=" + quote(v));
    return parts.length ? " [" + parts.join(", ") + "]" : "";
  }

  function boxTitle(moduleKey) {
    const entry = state.mode === "rolled" ? DATA.modules[moduleKey] : DATA.calls[moduleKey];
    return "\u229F " + (entry ? entry.lines[0] : moduleKey);  // a boxed minus: click to collapse
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
        const style = { ...DATA.dot.kinds[unit.kind] };
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

  async function render(reason) {
    const started = performance.now();
    const placed = placement();
    const edgeList = edges(placed);
    if (placed.units.size > MAX_DRAWN && !state.forceDraw) {
      tooLarge(placed.units.size);
      return;
    }
    const built = buildDot(placed, edgeList);
    let svgText;
    try {
      svgText = graphviz.layout(built.dot, "svg", "dot");
    } catch (err) {
      setStatus("layout failed: " + err.message + " (collapse more modules or switch view)", true);
      throw err;
    }
    ui.graph.innerHTML = svgText;
    const svg = ui.graph.querySelector("svg");
    svg.removeAttribute("width");
    svg.removeAttribute("height");
    annotate(svg, built);
    state.drawn = { placed, built, svg, edges: edgeList };
    const ms = performance.now() - started;
    timings.push({ reason: reason || "render", ms, nodes: placed.units.size, edges: edgeList.length });
    document.body.dataset.renders = String(timings.length);
    setStatus(`${placed.units.size} nodes, ${edgeList.length} edges, ${state.mode}; drawn in ${ms.toFixed(0)} ms`);
    syncControls();
  }

  function tooLarge(count) {
    ui.graph.innerHTML = `<div class="message"><p><b>${count} nodes</b> at this depth: laying out more than
      ${MAX_DRAWN} nodes takes long and may fail.</p><p>Collapse more modules (a smaller depth), switch to
      the rolled view, or <button type="button" id="torchlog-draw-anyway">draw anyway</button>.</p></div>`;
    el("torchlog-draw-anyway").onclick = () => { state.forceDraw = true; render("draw anyway"); };
    state.drawn = null;
    timings.push({ reason: "too large", ms: 0, nodes: count, edges: 0 });
    document.body.dataset.renders = String(timings.length);
    setStatus(`${count} nodes: not drawn`, true);
    syncControls();
  }

  // Tag the SVG so tests and scripts find nodes by label and boxes by module address.
  function annotate(svg, built) {
    for (const g of svg.querySelectorAll("g.node, g.cluster")) {
      const info = built.ids.get(g.id);
      if (!info) continue;
      if (info.type === "box") {
        g.dataset.module = info.key;
        g.dataset.expanded = "true";
      } else if (info.unit.kind === "module") {
        g.dataset.module = info.key.slice(MODULE_PREFIX.length);
        g.dataset.expanded = "false";
      } else if (info.unit.kind === "failed") {
        g.dataset.failed = "true";
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
    ui.status.classList.toggle("error", Boolean(isError));
  }

  function syncControls() {
    ui.mode.value = state.mode;
    ui.depth.value = String(state.depth);
    ui.depth.max = String(maxDepth + 1);
    ui.direction.value = state.direction;
    ui.buffers.checked = state.showBuffers;
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
    svg.setAttribute("viewBox", view.map((v) => v.toFixed(2)).join(" "));
  }

  function fit() {
    const svg = state.drawn && state.drawn.svg;
    if (!svg) return;
    const full = state.drawn.full || (state.drawn.full = graphBox(svg));
    const rect = ui.graph.getBoundingClientRect();
    const scale = Math.min(rect.width / full[2], rect.height / full[3], 1.5);
    if (scale >= 0.35) {
      const w = rect.width / scale, h = rect.height / scale;
      setView([full[0] - (w - full[2]) / 2, full[1] - (h - full[3]) / 2, w, h]);
      return;
    }
    // Too big to read whole: show the start of the graph (the inputs) at a readable size.
    const w = rect.width / 0.7, h = rect.height / 0.7;
    const top = state.direction === "BT" ? full[1] + full[3] - h : full[1];
    setView([full[0] + Math.max(0, (full[2] - w) / 2), top, w, h]);
  }

  function zoomAt(clientX, clientY, factor) {
    const view = state.view;
    if (!view) return;
    const rect = ui.graph.getBoundingClientRect();
    const fx = (clientX - rect.left) / rect.width, fy = (clientY - rect.top) / rect.height;
    const w = view[2] * factor, h = view[3] * factor;
    setView([view[0] + (view[2] - w) * fx, view[1] + (view[3] - h) * fy, w, h]);
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
    const rect = ui.graph.getBoundingClientRect();
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

  // ----- clicks: select, expand, collapse -------------------------------------------------------
  function onClick(ev) {
    if (ui.graph.dataset.justDragged) { delete ui.graph.dataset.justDragged; return; }
    const node = ev.target.closest("g.node");
    if (node) {
      if (node.dataset.expanded === "false") {
        toggleModule(node.dataset.module);
      } else {
        select(node.dataset.key);
      }
      return;
    }
    const box = ev.target.closest("g.cluster");
    if (box && box.dataset.module) toggleModule(box.dataset.module);
  }

  async function toggleModule(moduleKey) {
    const opening = !state.expanded.has(moduleKey);
    if (opening) state.expanded.add(moduleKey); else state.expanded.delete(moduleKey);
    state.selected = opening ? null : MODULE_PREFIX + moduleKey;
    showModule(moduleKey);
    await render(opening ? "expand " + moduleKey : "collapse " + moduleKey);
    focusModule(moduleKey);
  }

  function focusModule(moduleKey) {
    if (!state.drawn) return;
    fit();
    const target = state.drawn.svg.querySelector(`[data-module="${cssEscape(moduleKey)}"]`);
    if (target) { flash(target); centerOn(target); }
  }

  function select(key) {
    state.selected = key;
    const svg = state.drawn && state.drawn.svg;
    if (svg) {
      svg.querySelectorAll(".torchlog-selected").forEach((g) => g.classList.remove("torchlog-selected"));
      const id = state.drawn.built.nodeId.get(key);
      if (id) svg.getElementById(id).classList.add("torchlog-selected");
    }
    if (key === FAILED_KEY) showFailure();
    else if (key.startsWith(MODULE_PREFIX)) showModule(key.slice(MODULE_PREFIX.length));
    else if (state.mode === "rolled") showLayer(layerByLabel.get(key));
    else showPass(passByLabel.get(key));
  }

  function flash(element) {
    element.classList.add("torchlog-hit");
    setTimeout(() => element.classList.remove("torchlog-hit"), 2500);
  }

  // Move the view to a pass (or layer, or module): expand the modules around it, redraw when
  // that changed what is drawn, centre on it and open its panel.
  async function goTo(label) {
    const pass = passByLabel.get(label) || (layerByLabel.has(label) ? passByLabel.get(layerByLabel.get(label).passes[0]) : null);
    if (!pass) return false;
    if (pass.kind === "buffer" && !state.showBuffers) { state.showBuffers = true; state.drawn = null; }
    const chain = chains[state.mode].get(pass.label);
    let changed = !state.drawn;
    for (const key of chain) if (!state.expanded.has(key)) { state.expanded.add(key); changed = true; }
    if (changed) { await render("go to " + label); fit(); }
    const key = state.mode === "rolled" ? pass.layer : pass.label;
    const target = state.drawn.svg.getElementById(state.drawn.built.nodeId.get(key));
    select(key);
    flash(target);
    centerOn(target);
    return true;
  }

  async function goToModule(moduleKey) {
    const depth = moduleDepth[state.mode].get(moduleKey);
    if (depth === undefined) return false;
    const chainHolding = [...chains[state.mode].values()].find((c) => c.includes(moduleKey));
    let changed = false;
    for (const key of chainHolding.slice(0, chainHolding.indexOf(moduleKey))) {
      if (!state.expanded.has(key)) { state.expanded.add(key); changed = true; }
    }
    if (changed) await render("go to " + moduleKey);
    showModule(moduleKey);
    focusModule(moduleKey);
    return true;
  }

  // ----- search ----------------------------------------------------------------------------------
  let lastSearch = { text: null, index: -1 };

  function searchTargets(text) {
    const q = text.trim();
    if (!q) return [];
    const exact = [];
    if (passByLabel.has(q) || layerByLabel.has(q)) exact.push({ label: q });
    const moduleKeys = moduleDepth[state.mode];
    const asModule = state.mode === "rolled" ? q.replace(/:\d+$/, "") : (moduleKeys.has(q) ? q : q + ":1");
    if (moduleKeys.has(asModule)) exact.push({ module: asModule });
    if (exact.length) return exact;
    const lower = q.toLowerCase();
    const found = [];
    for (const p of DATA.passes) {
      if (p.func.toLowerCase() === lower || p.type === lower || p.label.startsWith(q)) found.push({ label: p.label });
    }
    if (!found.length) {
      for (const key of moduleKeys.keys()) if (key.includes(q)) found.push({ module: key });
      for (const p of DATA.passes) if (p.label.includes(q) || p.func.toLowerCase().includes(lower)) found.push({ label: p.label });
    }
    return found;
  }

  async function runSearch() {
    const text = ui.search.value;
    const targets = searchTargets(text);
    if (!targets.length) { setStatus(`nothing matches ${JSON.stringify(text)}`, true); return false; }
    lastSearch.index = lastSearch.text === text ? (lastSearch.index + 1) % targets.length : 0;
    lastSearch.text = text;
    const target = targets[lastSearch.index];
    const ok = target.label ? await goTo(target.label) : await goToModule(target.module);
    setStatus(`match ${lastSearch.index + 1} of ${targets.length} for ${JSON.stringify(text)}`);
    return ok;
  }

  function fillSearchList() {
    const options = new Set();
    for (const p of DATA.passes) { options.add(p.label); options.add(p.func); }
    for (const key of Object.keys(DATA.modules)) options.add(key);
    const list = el("torchlog-search-list");
    const fragment = document.createDocumentFragment();
    [...options].slice(0, 5000).forEach((value) => {
      const option = document.createElement("option");
      option.value = value;
      fragment.appendChild(option);
    });
    list.appendChild(fragment);
  }

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
    if (value === null || value === undefined) return "–";
    if (Number.isInteger(value)) return String(value);
    const abs = Math.abs(value);
    return abs !== 0 && (abs < 1e-3 || abs >= 1e5) ? value.toExponential(4) : value.toPrecision(5);
  }

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
    const where = site.line === null ? esc(site.file) : `${esc(site.file)}:${site.line} in ${esc(site.func)}`;
    return `<code>${where}</code>` + (site.text ? `<pre>${esc(site.text)}</pre>` : "");
  }

  function histogramSvg(hist) {
    const counts = hist.counts, width = 300, height = 60;
    const peak = Math.max(...counts, 1), barW = width / counts.length;
    const bars = counts.map((c, i) => {
      const h = Math.max(c > 0 ? 1 : 0, (c / peak) * height);
      return `<rect x="${(i * barW).toFixed(1)}" y="${(height - h).toFixed(1)}" width="${Math.max(barW - 1, 1).toFixed(1)}" height="${h.toFixed(1)}"><title>${c}</title></rect>`;
    }).join("");
    return `<svg class="hist" width="${width}" height="${height + 14}" viewBox="0 0 ${width} ${height + 14}">${bars}` +
      `<text x="0" y="${height + 12}" font-size="10">${esc(num(hist.lo))}</text>` +
      `<text x="${width}" y="${height + 12}" font-size="10" text-anchor="end">${esc(num(hist.hi))}</text></svg>`;
  }

  function statsHtml(p) {
    if (!p.saved) return "<p>Activation not saved.</p>";
    const s = p.stats;
    if (!s) return "<p>Saved (no statistics: not a tensor).</p>";
    const bad = (n) => (n ? `<span class="warn">${n}</span>` : "0");
    return rows([["min", num(s.min)], ["max", num(s.max)], ["mean", num(s.mean)], ["std", num(s.std)],
      ["zeros", (100 * s.zeros).toFixed(1) + " %"], ["NaN", bad(s.nan)], ["Inf", bad(s.inf)],
      ["elements", String(s.numel)]]) + (s.hist ? histogramSvg(s.hist) : "");
  }

  function passRows(p) {
    const modules = p.modules.length ? p.modules.map(moduleLink).join(" ‹ ") : "(top level)";
    return rows([
      ["function", `<code>${esc(p.func)}</code>`],
      ["kind", esc(p.kind) + (p.inplace ? " (in-place)" : "")],
      ["pass", p.npasses > 1 ? `${p.pass} of ${p.npasses}` : null],
      ["shape", esc(shapeText(p.shape))],
      ["dtype", esc(p.dtype)],
      ["size", humanSize(p.bytes)],
      ["address", p.address ? `<code>${esc(p.address)}</code>` : null],
      ["in modules", modules],
      ["output of", p.outputOf.length ? p.outputOf.map(moduleLink).join(", ") : null],
      ["call site", siteHtml(p.site)],
      ["params", p.params.length ? p.params.map(([a, s, n]) => `<code>${esc(a)}</code> ${esc(shapeText(s))}, ${n}`).join("<br>") : null],
      ["time", p.timeUs ? `${p.timeUs} µs` : null],
      ["parents", p.parents.length ? p.parents.map(([l, arg]) => link(l) + (arg ? ` <small>(${esc(arg)})</small>` : "")).join("<br>") : "none"],
      ["children", p.children.length ? p.children.map((l) => link(l)).join("<br>") : "none"],
      ["gradient", p.grad ? `${esc(shapeText(p.grad.shape))}, norm ${num(p.grad.norm)}` : null],
    ]);
  }

  function showPass(p) {
    ui.panel.innerHTML = `<h2>${esc(p.label)}</h2>` + passRows(p) + "<h3>Activation</h3>" + statsHtml(p);
  }

  function showLayer(layer) {
    const passes = layer.passes.map((l) => passByLabel.get(l));
    const first = passes[0];
    let html = `<h2>${esc(layer.label)}${passes.length > 1 ? ` (x${passes.length})` : ""}</h2>`;
    if (passes.length === 1) { ui.panel.innerHTML = html + passRows(first) + "<h3>Activation</h3>" + statsHtml(first); return; }
    html += rows([["function", `<code>${esc(first.func)}</code>`], ["kind", esc(first.kind)],
      ["passes", String(passes.length)], ["call site", siteHtml(first.site)]]);
    html += passes.map((p, i) => `<details${i === 0 ? " open" : ""}><summary>pass ${p.pass}: ${esc(shapeText(p.shape))}` +
      `${p.stats && (p.stats.nan || p.stats.inf) ? ' <span class="warn">NaN/Inf</span>' : ""}</summary>` +
      passRows(p) + statsHtml(p) + "</details>").join("");
    ui.panel.innerHTML = html;
  }

  function showModule(moduleKey) {
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
      ["input shapes", call ? shapes(call.inputs) : null],
      ["output shapes", call ? shapes(call.outputs) : null],
      ["ops inside", String(inside)],
      ["state", state.expanded.has(moduleKey) ? "expanded" : "collapsed"],
      ["submodules", module && module.children.length ? module.children.map(esc).join(", ") : null],
    ]);
  }

  function showFailure() {
    const f = DATA.failure;
    ui.panel.innerHTML = `<h2 class="error">forward pass failed</h2>` +
      `<p class="error">${esc(f.text)}</p>` + (f.error ? `<pre class="error">${esc(f.error)}</pre>` : "") +
      rows([["inputs", f.parents.length ? f.parents.map((l) => link(l)).join("<br>") : "none"]]);
  }

  function onPanelClick(ev) {
    const a = ev.target.closest("a");
    if (!a) return;
    if (a.dataset.goto) goTo(a.dataset.goto);
    else if (a.dataset.gotoModule) goToModule(a.dataset.gotoModule);
  }

  // ----- export -------------------------------------------------------------------------------------
  function currentSvgText() {
    const svg = state.drawn.svg.cloneNode(true);
    const full = state.drawn.full || graphBox(state.drawn.svg);
    svg.setAttribute("viewBox", full.join(" "));
    svg.setAttribute("width", full[2]);
    svg.setAttribute("height", full[3]);
    svg.setAttribute("xmlns", "http://www.w3.org/2000/svg");
    return new XMLSerializer().serializeToString(svg);
  }

  function download(blob, name) {
    const a = document.createElement("a");
    a.href = URL.createObjectURL(blob);
    a.download = name;
    document.body.appendChild(a);
    a.click();
    setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
  }

  function exportSvg() {
    if (!state.drawn) return;
    download(new Blob([currentSvgText()], { type: "image/svg+xml" }), `${DATA.model}.svg`);
  }

  // The whole graph as a PNG data URL (at most 16,000 pixels on its longer side).
  function pngDataUrl() {
    const full = state.drawn.full || graphBox(state.drawn.svg);
    const scale = Math.min(2, 16000 / Math.max(full[2], full[3]));
    return new Promise((resolve, reject) => {
      const image = new Image();
      image.onload = () => {
        const canvas = document.createElement("canvas");
        canvas.width = Math.ceil(full[2] * scale);
        canvas.height = Math.ceil(full[3] * scale);
        const ctx = canvas.getContext("2d");
        ctx.fillStyle = "white";
        ctx.fillRect(0, 0, canvas.width, canvas.height);
        ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
        resolve(canvas.toDataURL("image/png"));
      };
      image.onerror = () => reject(new Error("the SVG could not be drawn on a canvas"));
      image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(currentSvgText());
    });
  }

  async function exportPng() {
    if (!state.drawn) return;
    const blob = await (await fetch(await pngDataUrl())).blob();
    download(blob, `${DATA.model}.png`);
  }

  // ----- controls -------------------------------------------------------------------------------------
  async function setDepth(depth) {
    state.depth = Math.max(1, Math.min(maxDepth + 1, depth | 0));
    state.forceDraw = false;
    expandToDepth();
    await render("depth " + state.depth);
    fit();
  }

  async function setMode(mode) {
    state.mode = mode;
    state.selected = null;
    state.forceDraw = false;
    expandToDepth();
    await render("mode " + mode);
    fit();
  }

  function installControls() {
    ui.mode.onchange = () => setMode(ui.mode.value);
    ui.depth.onchange = () => setDepth(parseInt(ui.depth.value, 10) || 1);
    el("torchlog-expand-all").onclick = () => setDepth(maxDepth + 1);
    el("torchlog-collapse-all").onclick = () => setDepth(1);
    ui.direction.onchange = async () => { state.direction = ui.direction.value; await render("direction"); fit(); };
    ui.buffers.onchange = async () => { state.showBuffers = ui.buffers.checked; await render("buffers"); fit(); };
    el("torchlog-fit").onclick = fit;
    el("torchlog-export-svg").onclick = exportSvg;
    el("torchlog-export-png").onclick = exportPng;
    ui.search.addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); runSearch(); } });
    ui.search.addEventListener("change", () => { if (ui.search.value) runSearch(); });
    ui.graph.addEventListener("click", onClick);
    ui.panel.addEventListener("click", onPanelClick);
    window.addEventListener("resize", () => state.view && fit());
    installPanZoom();
  }

  async function start() {
    installControls();
    fillSearchList();
    expandToDepth();
    syncControls();
    if (!DATA.passes.length) { setStatus("this history has no ops", true); return; }
    setStatus("loading Graphviz…");
    graphviz = await window.torchlogGraphviz.Graphviz.load();
    await render("open");
    fit();
    if (DATA.view.focus) await goTo(DATA.view.focus);
    else if (DATA.failure) select(FAILED_KEY);
    document.body.dataset.ready = "true";
  }

  Object.assign(window.torchlogViewer, { runSearch, svgText: currentSvgText, pngDataUrl });
  window.torchlogViewer.ready = start().catch((err) => {
    setStatus("could not draw the graph: " + err.message, true);
    document.body.dataset.ready = "error";
    throw err;
  });
})();
