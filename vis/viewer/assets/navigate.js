// Moving around: clicks that select, expand and collapse, going to a label, module or the
// op that raised.
// ----- clicks: select, expand, collapse -------------------------------------------------------
function onClick(ev) {
  if (ui.graph.dataset.justDragged) { delete ui.graph.dataset.justDragged; return; }
  const marker = ev.target.closest("g.torchlog-marker");
  if (marker) { goToNode(marker.dataset.from); return; }
  const node = ev.target.closest("g.node");
  if (node && node.dataset.repeat) { unfoldRun(node.dataset.key); return; }
  if (node) {
    if (node.dataset.expanded === "false") {
      toggleModule(node.dataset.key.slice(MODULE_PREFIX.length));
    } else {
      select(node.dataset.key);
    }
    return;
  }
  const box = ev.target.closest("g.cluster");
  if (box && box.dataset.module) toggleModule(box.dataset.key);
}

// The drawn box or node of a module key, expanded or not.
function moduleElement(moduleKey) {
  const svg = state.drawn && state.drawn.svg;
  if (!svg) return null;
  return svg.querySelector(`g.cluster[data-key="${cssEscape(moduleKey)}"]`) ||
    svg.querySelector(`g.node[data-key="${cssEscape(MODULE_PREFIX + moduleKey)}"]`);
}

// `moduleName`: a module key, or an address (its first call) as scripts name modules.
async function toggleModule(moduleName) {
  const moduleKey = moduleKeyOf(moduleName);
  if (moduleKey === null) return false;
  const opening = !state.expanded.has(moduleKey);
  const element = moduleElement(moduleKey);
  const anchor = element && element.getBoundingClientRect(), scale = currentScale();
  const before = screenPlaces(), rects = drawnRects();
  if (opening) state.expanded.add(moduleKey); else state.expanded.delete(moduleKey);
  state.selected = opening ? null : MODULE_PREFIX + moduleKey;
  showModule(moduleKey);
  await render(opening ? "expand " + moduleKey : "collapse " + moduleKey);
  if (!state.drawn) return true;
  pinAround(moduleKey, rects, opening);
  drawOverview();
  keepInPlace(moduleKey, anchor, scale);
  flash(moduleElement(moduleKey));
  timings[timings.length - 1].glides = glideFrom(before, (key) => insideModule(key, moduleKey));
  return true;
}

function focusModule(moduleKey) {
  if (!state.drawn) return;
  fit();
  const target = moduleElement(moduleKey);
  if (target) { flash(target); centerOn(target); }
}

// Select node `key`; the panel shows `shown` (a pass or layer the node holds), else the node.
function select(key, shown) {
  state.selected = key;
  showPath(key);
  storeSelection(key);
  const svg = state.drawn && state.drawn.svg;
  if (svg) {
    svg.querySelectorAll(".torchlog-selected").forEach((g) => g.classList.remove("torchlog-selected"));
    const id = state.drawn.built.nodeId.get(key);
    if (id) svg.getElementById(id).classList.add("torchlog-selected");
  }
  ui.panel.scrollTop = 0;  // a new selection's panel starts at its top
  if (key === FAILED_KEY) showFailure();
  else if (key.startsWith(MODULE_PREFIX)) showModule(key.slice(MODULE_PREFIX.length));
  else if (state.mode === "rolled") showLayer(layerByLabel.get(shown || key));
  else showPass(passByLabel.get(shown || key));
}

// Mark what a search or link went to; the mark stays until the next one, so it can be found
// again after looking elsewhere.
function flash(element) {
  if (!element) return;
  element.ownerSVGElement.querySelectorAll(".torchlog-hit").forEach((g) => g.classList.remove("torchlog-hit"));
  element.classList.add("torchlog-hit");
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
  const key = state.drawn.placed.unitOf.get(pass.label);
  const target = state.drawn.svg.getElementById(state.drawn.built.nodeId.get(key));
  select(key, state.mode === "rolled" ? pass.layer : pass.label);
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

// Select and centre a drawn node by its key (a folded edge's marker leads to its tail).
function goToNode(key) {
  const target = state.drawn && state.drawn.svg.getElementById(state.drawn.built.nodeId.get(key));
  if (!target) return;
  select(key);
  flash(target);
  centerOn(target);
}

// Show the op that raised: open the modules around it, centre it, open its panel.
async function goToFailure() {
  let changed = false;
  for (const key of failureChain()) if (!state.expanded.has(key)) { state.expanded.add(key); changed = true; }
  if (changed) { await render("go to the failure"); fit(); }
  const target = state.drawn.svg.getElementById(state.drawn.built.nodeId.get(FAILED_KEY));
  select(FAILED_KEY);
  flash(target);
  centerOn(target);
  return true;
}

// ----- the keyboard ---------------------------------------------------------------------------
// `/` goes to the search box; Escape leaves it, or closes the result list and the selection;
// arrows step from the selected node along the drawn edges: up to a parent, down to a child,
// left and right among the children of its first parent (as drawn, left to right).
function drawnNeighbours(key, towards) {
  if (!state.drawn) return [];
  const links = state.drawn.edges.concat(state.drawn.folded || []);
  const found = links.filter((e) => (towards === "up" ? e.head : e.tail) === key)
    .map((e) => (towards === "up" ? e.tail : e.head)).filter((k) => k !== key);
  return [...new Set(found)];
}

function stepKey(key, arrow) {
  if (arrow === "ArrowUp") return drawnNeighbours(key, "up")[0];
  if (arrow === "ArrowDown") return drawnNeighbours(key, "down")[0];
  const parent = drawnNeighbours(key, "up")[0];
  if (parent === undefined) return undefined;
  const place = (k) => { const g = state.drawn.svg.getElementById(state.drawn.built.nodeId.get(k)); return g ? g.getBoundingClientRect().left : 0; };
  const siblings = drawnNeighbours(parent, "down").sort((a, b) => place(a) - place(b));
  const at = siblings.indexOf(key);
  return siblings[(at + (arrow === "ArrowRight" ? 1 : siblings.length - 1)) % siblings.length];
}

function onKey(ev) {
  const typing = ev.target.closest && ev.target.closest("input, select, textarea");
  if (ev.key === "Escape") {
    if (typing) { ev.target.blur(); return; }
    el("torchlog-results").hidden = true;
    if (state.drawn) state.drawn.svg.querySelectorAll(".torchlog-selected").forEach((g) => g.classList.remove("torchlog-selected"));
    state.selected = null;
    ui.panel.innerHTML = "";
    showPath(null);
    return;
  }
  if (typing || ev.ctrlKey || ev.metaKey || ev.altKey) return;
  if (ev.key === "/") { ev.preventDefault(); ui.search.focus(); ui.search.select(); return; }
  if (!ev.key.startsWith("Arrow") || !state.selected || !state.drawn) return;
  const next = stepKey(state.selected, ev.key);
  if (next === undefined) return;
  ev.preventDefault();
  const target = state.drawn.svg.getElementById(state.drawn.built.nodeId.get(next));
  select(next);
  flash(target);
  const box = target.getBoundingClientRect(), area = ui.graph.getBoundingClientRect();
  if (box.top < area.top + 24 || box.bottom > area.bottom || box.left < area.left || box.right > area.right) centerOn(target);
}
