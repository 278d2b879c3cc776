// What to draw: the model's passes indexed once, the viewer's state, which node each pass
// goes to, and the edges between those nodes.

const DATA = JSON.parse(document.getElementById("torchlog-data").textContent);
const MODULE_PREFIX = "module ";  // keys of collapsed modules; labels never hold a space
const FAILED_KEY = "failed op";
const MAX_DRAWN = 2500;  // above this many nodes, ask before laying out (dot slows, then overflows)
const el = (id) => document.getElementById(id);
const ui = {
  graph: el("torchlog-graph"), drawing: el("torchlog-drawing"), breadcrumb: el("torchlog-breadcrumb"),
  panel: el("torchlog-panel"), status: el("torchlog-status"),
  mode: el("torchlog-mode"), depth: el("torchlog-depth"), search: el("torchlog-search"),
  direction: el("torchlog-direction"), buffers: el("torchlog-buffers"), plumbing: el("torchlog-plumbing"),
  repeats: el("torchlog-repeats"),
  colour: el("torchlog-colour"),
};

// ----- the model, indexed once ---------------------------------------------------------
const passByLabel = new Map(DATA.passes.map((p) => [p.label, p]));
const passIndex = new Map(DATA.passes.map((p, i) => [p.label, i]));
const layerByLabel = new Map(DATA.layers.map((l) => [l.label, l]));
const chains = {  // module keys holding each pass, outermost first
  unrolled: new Map(DATA.passes.map((p) => [p.label, p.modules.slice().reverse()])),
  rolled: new Map(DATA.passes.map((p) => [p.label,
    p.modules.slice().reverse().map((call) => call.slice(0, call.lastIndexOf(":")))])),
};
const moduleDepth = { unrolled: new Map(), rolled: new Map() };
const moduleChains = { unrolled: new Map(), rolled: new Map() };  // key -> modules down to it
for (const mode of ["unrolled", "rolled"]) {
  for (const chain of chains[mode].values()) {
    chain.forEach((key, i) => {
      const known = moduleDepth[mode].get(key);
      if (known === undefined || i + 1 < known) {
        moduleDepth[mode].set(key, i + 1);
        moduleChains[mode].set(key, chain.slice(0, i + 1));
      }
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
  showPlumbing: false,  // helper runs and folds drawn open
  foldRepeats: false,   // runs of repeated blocks drawn as one node (repeats.js)
  unfoldedRuns: new Set(),  // ... except these, opened by a click
  histLog: false,       // histogram counts on a log scale (charts.js)
  colour: DATA.colour ? "custom" : "kind",  // what fills the op nodes (colour.js)
  selected: null,     // a node key, or a module key
  forceDraw: false,
  drawn: null,        // what the last render drew
  view: null,         // the SVG viewBox [x, y, w, h]
};
const timings = [];
window.torchlogViewer = { state, timings, data: DATA, render, goTo, setDepth, setMode, toggleModule };

// Plumbing (helper runs and folds of ops outside every module) opens only when asked.
function expandToDepth() {
  state.expanded = new Set();
  for (const [key, depth] of moduleDepth[state.mode]) {
    if (isPlumbing(key) ? state.showPlumbing : depth < state.depth) state.expanded.add(key);
  }
}

function scopeEntry(moduleKey) {
  return state.mode === "rolled" ? DATA.modules[moduleKey] : DATA.calls[moduleKey];
}

function isPlumbing(moduleKey) {
  const entry = scopeEntry(moduleKey);
  return Boolean(entry) && (entry.kind === "helper" || entry.kind === "fold");
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
    if (key === undefined && p.callOf !== undefined) key = unitOf.get(p.callOf);  // one call, one node
    if (key === undefined) key = unitKey(p, rolled, units);
    if (rolled && !layerUnit.has(p.layer)) layerUnit.set(p.layer, key);
    unitOf.set(p.label, key);
    units.get(key).members.push(p);
  }
  if (DATA.failure) {
    units.set(FAILED_KEY, { key: FAILED_KEY, kind: "failed", boxes: failureBoxes(), members: [] });
  }
  const placed = { units, unitOf };
  foldRepeats(placed);
  return placed;
}

// The op that raised sits in the module call it ran in, as deep as that is open.
function failureChain() {
  const call = DATA.failure && DATA.failure.module;
  if (!call) return [];
  const key = state.mode === "rolled" ? call.slice(0, call.lastIndexOf(":")) : call;
  return moduleChains[state.mode].get(key) || [];
}

function failureBoxes() {
  const chain = failureChain();
  const open = chain.findIndex((key) => !state.expanded.has(key));
  return open === -1 ? chain : chain.slice(0, open);
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
  if (unit.kind === "repeat") return repeatLines(unit);
  if (unit.kind === "module") {
    const moduleKey = unit.key.slice(MODULE_PREFIX.length);
    const entry = scopeEntry(moduleKey);
    const lines = entry ? entry.lines.slice() : [moduleKey];
    lines[0] = "\u229E " + withoutPrefix(lines[0], unit.boxes[unit.boxes.length - 1]);  // a boxed plus: click to expand
    const acted = intervenedPasses(unit);
    if (acted) lines.push(`intervened: ${acted} pass${acted > 1 ? "es" : ""} inside`);
    return lines;
  }
  const first = unit.members[0];
  if (state.mode === "rolled") return first.layerCallLines || layerByLabel.get(first.layer).lines;
  return first.callLines || first.lines;
}

// How many of a collapsed node's passes an intervention acted on (they are hidden inside it).
function intervenedPasses(unit) {
  return unit.members.filter((p) => p.interventions && p.interventions.length).length;
}

function edges(placed) {
  const found = new Map();
  // A node feeding itself is drawn only for a rolled layer (a loop's recurrence).
  const add = (tail, head, attrs, loop) => {
    if (tail === undefined || head === undefined || (tail === head && !loop)) return;
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

// A value read by a chain of blocks (the attention mask, read by every layer; position
// embeddings) would draw an edge to each, pulling the chain into a staircase beside a rail
// of parallel edges. When three or more heads of one tail lie on one path of the graph, only
// the edge to the first is drawn; the others become markers on their heads (`folded`).
const FAN_MIN = 3;

function foldFans(edgeList, placed) {
  const order = new Map();
  for (const unit of placed.units.values()) order.set(unit.key, unit.members.length ? passIndex.get(unit.members[0].label) : Infinity);
  const next = new Map(), byTail = new Map();
  for (const e of edgeList) {
    if (e.tail === e.head) continue;
    if (!next.has(e.tail)) next.set(e.tail, []);
    next.get(e.tail).push(e.head);
    if (!byTail.has(e.tail)) byTail.set(e.tail, new Map());
    const heads = byTail.get(e.tail);
    if (!heads.has(e.head)) heads.set(e.head, []);
    heads.get(e.head).push(e);
  }
  const dropped = new Set(), folded = [];
  for (const [tail, heads] of byTail) {
    if (heads.size < FAN_MIN) continue;
    const ordered = [...heads.keys()].sort((a, b) => order.get(a) - order.get(b));
    if (!ordered.every((h, i) => i === 0 || reaches(next, ordered[i - 1], h, tail, order))) continue;
    for (const head of ordered.slice(1)) {
      for (const e of heads.get(head)) dropped.add(e);
      folded.push({ tail, head });
    }
  }
  return { kept: edgeList.filter((e) => !dropped.has(e)), folded };
}

// Whether `to` can be reached from `from` without passing through `skip`; only nodes that
// run before `to` are searched.
function reaches(next, from, to, skip, order) {
  const limit = order.get(to), seen = new Set([from]), stack = [from];
  while (stack.length) {
    const key = stack.pop();
    for (const child of next.get(key) || []) {
      if (child === to) return true;
      if (child === skip || seen.has(child) || !(order.get(child) <= limit)) continue;
      seen.add(child);
      stack.push(child);
    }
  }
  return false;
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
      // Which passes the edge joins go in its own label, which the layout makes room for;
      // head and tail labels are placed after it and landed on box titles and nodes.
      const spans = [link.out === allPasses(parent) ? "" : "Out " + link.out,
        link.in === allPasses(layer) ? "" : "In " + link.in].filter(Boolean).join(", ");
      const showArg = passByLabel.get(layer.passes[0]).showArg;
      const args = showArg ? link.args.join(", ") : "";  // one edge per layer pair, its slots listed
      add(tail, head, { label: [shape, args, spans].filter(Boolean).join("\n") }, true);
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

// A module key is a call ('h.0:2') in the unrolled view and an address ('h.0') in the
// rolled one; the page shows the address and the call apart (data-module, data-call).
function splitModuleKey(key) {
  const call = state.mode === "rolled" ? null : DATA.calls[key];
  return call ? [call.address, call.call] : [key, null];
}

// What a script or a search names a module by: its key, or its address (the first call).
function moduleKeyOf(text) {
  const keys = moduleDepth[state.mode];
  if (keys.has(text)) return text;
  if (state.mode === "rolled") return keys.has(text.replace(/:\d+$/, "")) ? text.replace(/:\d+$/, "") : null;
  return keys.has(text + ":1") ? text + ":1" : null;
}
