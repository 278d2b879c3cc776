// Repeated blocks: a chain of REPEAT_MIN or more collapsed calls of one module type side by
// side in one box, each reading the one before (GPT-2's h.0 ... h.11, a ResNet stage's blocks),
// drawn as one node `h.0 ... h.11 (12x GPT2Block)` when "repeats" is ticked; the page ticks it
// itself when even its shallowest view would not fit the window readably. Clicking the node
// draws the blocks again, one by one.
const REPEAT_PREFIX = "repeat ";
const REPEAT_MIN = 3;

function moduleType(unit) {
  const module = DATA.modules[splitModuleKey(unit.key.slice(MODULE_PREFIX.length))[0]];
  return module ? module.type : null;
}

// Fold each run of repeated blocks of `placed` into one unit (kind "repeat").
function foldRepeats(placed) {
  if (!state.foldRepeats) return;
  const groups = new Map();
  for (const unit of placed.units.values()) {
    if (unit.kind !== "module" || isPlumbing(unit.key.slice(MODULE_PREFIX.length)) || !unit.members.length) continue;
    const type = moduleType(unit);
    if (!type) continue;
    const group = unit.boxes.join("\u0001") + "\u0002" + type;
    if (!groups.has(group)) groups.set(group, []);
    groups.get(group).push(unit);
  }
  for (const list of groups.values()) {
    list.sort((a, b) => passIndex.get(a.members[0].label) - passIndex.get(b.members[0].label));
    let run = [list[0]];
    for (const unit of list.slice(1)) {
      if (readsFrom(unit, run[run.length - 1], placed)) { run.push(unit); continue; }
      mergeRun(placed, run);
      run = [unit];
    }
    mergeRun(placed, run);
  }
}

function readsFrom(unit, previous, placed) {
  return unit.members.some((p) => p.parents.some(([label]) => placed.unitOf.get(label) === previous.key));
}

function mergeRun(placed, run) {
  if (run.length < REPEAT_MIN) return;
  const key = REPEAT_PREFIX + run[0].key.slice(MODULE_PREFIX.length);
  if (state.unfoldedRuns.has(key)) return;
  const unit = { key, kind: "repeat", boxes: run[0].boxes, members: [],
    run: run.map((u) => u.key.slice(MODULE_PREFIX.length)), type: moduleType(run[0]) };
  for (const part of run) {
    placed.units.delete(part.key);
    for (const p of part.members) { unit.members.push(p); placed.unitOf.set(p.label, key); }
  }
  placed.units.set(key, unit);
}

function repeatName(unit) {
  const parent = unit.boxes[unit.boxes.length - 1];
  const name = (moduleKey) => withoutPrefix(splitModuleKey(moduleKey)[0], parent);
  return `${name(unit.run[0])} \u2026 ${name(unit.run[unit.run.length - 1])}`;
}

function repeatLines(unit) {
  const entries = unit.run.map((k) => scopeEntry(k)).filter(Boolean);
  const lines = [`\u229E ${repeatName(unit)} (${unit.run.length}\u00D7 ${unit.type})`];
  const first = entries[0] && entries[0].lines.find((l) => l.startsWith("in: "));
  const last = entries.length && entries[entries.length - 1].lines.find((l) => l.startsWith("out: "));
  if (first) lines.push(first);
  if (last) lines.push(last);
  const params = unit.run.reduce((sum, k) => sum + ((DATA.modules[splitModuleKey(k)[0]] || {}).params || 0), 0);
  if (params) lines.push(`params: ${params.toLocaleString("en-US")}`);
  return lines;
}

async function setRepeats(fold) {
  state.foldRepeats = Boolean(fold);
  state.unfoldedRuns = new Set();
  await render(fold ? "fold repeats" : "unfold repeats");
  fitReadable();
}

// Draw the blocks of a folded run one by one, the first where the run's node was.
async function unfoldRun(key) {
  const unit = state.drawn && state.drawn.placed.units.get(key);
  if (!unit) return false;
  const node = state.drawn.svg.querySelector(`g.node[data-key="${cssEscape(key)}"]`);
  const anchor = node && node.getBoundingClientRect(), scale = currentScale();
  state.unfoldedRuns.add(key);
  await render("unfold " + key);
  if (state.drawn) keepInPlace(unit.run[0], anchor, scale);
  return true;
}
