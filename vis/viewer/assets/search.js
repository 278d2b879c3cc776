// Search: a label, module or function, or a query of terms that all must hold, with a list of
// the results; the selection lives in the URL hash, so a view can be shared and reopened.
//
//   h.2.attn/softmax   h.2.attn softmax   ops named softmax inside module h.2.attn
//   func:softmax   shape:(1,4,32,32)   in:h.2   dtype:int64   kind:param
//   nan>0   inf>0   std>10   zeros>0.9   mean<0   min<-5   max>=100   absmax>1e3   masked>0.4
const MAX_RESULTS = 200;
const STAT_TERM = /^(nan|inf|std|mean|min|max|zeros|absmax|numel|masked)(>=|<=|>|<|=)(-?[\d.]+(?:e[-+]?\d+)?)$/i;
let lastSearch = { text: null, index: -1 };

// ----- queries -------------------------------------------------------------------------------
function statValue(p, name) {
  const s = p.stats;
  if (!s) return null;
  if (name === "absmax") return s.min === null ? null : Math.max(Math.abs(s.min), Math.abs(s.max));
  if (name === "masked") return s.numel ? (s.masked || 0) / s.numel : null;  // a share, as zeros
  return s[name] === undefined ? null : s[name];
}

function compare(value, op, bound) {
  if (value === null || value === undefined) return false;
  return op === ">" ? value > bound : op === "<" ? value < bound : op === ">=" ? value >= bound
    : op === "<=" ? value <= bound : value === bound;
}

// The addresses of the modules a pass ran in, outermost first ('h.2', 'h.2.attn').
function addressesOf(p) {
  return chains.rolled.get(p.label);
}

function inModule(p, prefix) {
  return addressesOf(p).some((address) => address === prefix || address.startsWith(prefix + "."));
}

function namedAs(p, term) {
  const lower = term.toLowerCase();
  return p.func.toLowerCase() === lower || p.type === lower || p.label.startsWith(term) ||
    p.func.toLowerCase().replace(/_/g, "") === lower;
}

// One test per term of the query; null when the query is a plain word (a label, module or
// name looked up the simple way).
function queryTests(text) {
  const spaced = text.trim().replace(/\(([^)]*)\)/g, (m) => m.replace(/\s+/g, ""));
  const terms = spaced.split(/\s+/).filter(Boolean);
  const isAddress = (t) => Object.prototype.hasOwnProperty.call(DATA.modules, t);
  const plain = terms.length === 1 && !/[:<>=/]/.test(terms[0]);
  if (plain) return null;
  return terms.map((term) => {
    const stat = STAT_TERM.exec(term);
    if (stat) return (p) => compare(statValue(p, stat[1].toLowerCase()), stat[2], Number(stat[3]));
    const slash = term.lastIndexOf("/");
    if (slash > 0) {
      const prefix = term.slice(0, slash), name = term.slice(slash + 1);
      return (p) => inModule(p, prefix) && (!name || namedAs(p, name));
    }
    const [key, value] = term.includes(":") ? [term.slice(0, term.indexOf(":")), term.slice(term.indexOf(":") + 1)] : [null, term];
    if (key === "func") return (p) => p.func.toLowerCase() === value.toLowerCase();
    if (key === "shape") return (p) => shapeText(p.shape).replace(/\s+/g, "") === value;
    if (key === "in" || key === "module") return (p) => inModule(p, value);
    if (key === "dtype") return (p) => p.dtype === value;
    if (key === "kind") return (p) => p.kind === value;
    if (key === "label") return (p) => p.label.startsWith(value);
    if (isAddress(term)) return (p) => inModule(p, term);
    return (p) => namedAs(p, term);
  });
}

function searchTargets(text) {
  const q = text.trim();
  if (!q) return [];
  const tests = queryTests(q);
  if (tests) {
    const found = DATA.passes.filter((p) => tests.every((test) => test(p))).map((p) => ({ label: p.label }));
    const failed = DATA.failure && DATA.failure.func && q.toLowerCase() === `func:${DATA.failure.func.toLowerCase()}`;
    return failed ? [{ failed: true }].concat(found) : found;
  }
  const exact = [];
  if (passByLabel.has(q) || layerByLabel.has(q)) exact.push({ label: q });
  const asModule = moduleKeyOf(q);
  if (asModule !== null) exact.push({ module: asModule });
  if (exact.length) return exact;
  const lower = q.toLowerCase();
  const failed = DATA.failure && (lower === (DATA.failure.func || "").toLowerCase() ||
    ["failed", "failure", "error", "raised"].includes(lower)) ? [{ failed: true }] : [];
  const found = DATA.passes.filter((p) => namedAs(p, q)).map((p) => ({ label: p.label }));
  if (!found.length && !failed.length) {
    for (const key of moduleDepth[state.mode].keys()) if (key.includes(q)) found.push({ module: key });
    for (const p of DATA.passes) if (p.label.includes(q) || p.func.toLowerCase().includes(lower)) found.push({ label: p.label });
  }
  return failed.concat(found);
}

// In the rolled view a layer is one node: its passes are one result.
function distinctTargets(targets) {
  if (state.mode !== "rolled") return targets;
  const seen = new Set();
  return targets.filter((t) => {
    const key = t.label ? passByLabel.get(t.label).layer : t.module || "failed";
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

async function goToTarget(target) {
  return target.failed ? goToFailure() : target.label ? goTo(target.label) : goToModule(target.module);
}

async function runSearch() {
  const text = ui.search.value;
  const targets = distinctTargets(searchTargets(text));
  if (!targets.length) {
    showResults([]);
    setStatus(`nothing matches ${JSON.stringify(text)}`, true);
    return false;
  }
  lastSearch.index = lastSearch.text === text ? (lastSearch.index + 1) % targets.length : 0;
  if (lastSearch.text !== text) showResults(targets.length > 1 ? targets : []);
  lastSearch.text = text;
  const ok = await goToTarget(targets[lastSearch.index]);
  markResult(lastSearch.index);
  setStatus(`match ${lastSearch.index + 1} of ${targets.length} for ${JSON.stringify(text)}`);
  return ok;
}

// ----- the result list ---------------------------------------------------------------------------
function resultHtml(target, i) {
  if (target.failed) return `<li data-index="${i}"><b>forward pass failed</b></li>`;
  if (target.module) return `<li data-index="${i}"><b>${esc(moduleName(target.module))}</b> <small>module</small></li>`;
  const p = passByLabel.get(target.label);
  const where = addressesOf(p).join(" \u203A ") || "(top level)";
  return `<li data-index="${i}"><b>${esc(state.mode === "rolled" ? p.layer : p.label)}</b> ` +
    `<small>${esc(where)}</small> <code>${esc(shapeText(p.shape))}</code></li>`;
}

function showResults(targets) {
  const list = el("torchlog-results");
  list.hidden = !targets.length;
  list.dataset.count = String(targets.length);
  const shown = targets.slice(0, MAX_RESULTS);
  list.innerHTML = `<div>${targets.length} results${targets.length > MAX_RESULTS ? `, first ${MAX_RESULTS} listed` : ""}` +
    ` <a data-close="1">close</a></div><ol>` + shown.map(resultHtml).join("") + "</ol>";
  list.targets = targets;
}

function markResult(index) {
  const list = el("torchlog-results");
  list.querySelectorAll("li.current").forEach((li) => li.classList.remove("current"));
  const li = list.querySelector(`li[data-index="${index}"]`);
  if (li) { li.classList.add("current"); li.scrollIntoView({ block: "nearest" }); }
}

function installResults() {
  const list = el("torchlog-results");
  for (const type of ["mousedown", "wheel", "click"]) list.addEventListener(type, (ev) => ev.stopPropagation());
  list.addEventListener("click", async (ev) => {
    if (ev.target.closest("a[data-close]")) { list.hidden = true; return; }
    const li = ev.target.closest("li[data-index]");
    if (!li) return;
    lastSearch.index = Number(li.dataset.index);
    await goToTarget(list.targets[lastSearch.index]);
    markResult(lastSearch.index);
    setStatus(`match ${lastSearch.index + 1} of ${list.targets.length} for ${JSON.stringify(lastSearch.text)}`);
  });
  ui.search.addEventListener("keydown", (ev) => { if (ev.key === "Escape") list.hidden = true; });
  window.addEventListener("hashchange", openFromHash);  // an address edited by hand
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

// ----- the selection in the URL hash -------------------------------------------------------------
// '#softmax_3_141' (a pass or layer), '#module=h.2.attn:1', '#failed'.
function hashOf(key) {
  if (!key) return "";
  if (key === FAILED_KEY) return "#failed";
  if (key.startsWith(MODULE_PREFIX)) return "#module=" + encodeURIComponent(key.slice(MODULE_PREFIX.length));
  return "#" + encodeURIComponent(key);
}

function storeSelection(key) {
  const hash = hashOf(key);
  if (hash === location.hash) return;
  try {
    history.replaceState(null, "", hash || location.pathname + location.search);
  } catch (err) {  // a srcdoc frame may refuse: the selection then stays unshared
    return;
  }
}

async function openFromHash() {
  const hash = decodeURIComponent(location.hash.slice(1));
  if (!hash) return false;
  if (hash === "failed" && DATA.failure) return goToFailure();
  const found = hash.startsWith("module=") ? moduleKeyOf(hash.slice("module=".length)) !== null &&
    await goToModule(moduleKeyOf(hash.slice("module=".length))) : await goTo(hash);
  if (!found) unknownHash(hash);
  return found;
}

// A link to something this history does not hold: say so, where the eye goes first.
function unknownHash(hash) {
  const text = `The link's #${hash} names nothing in this history (a label such as softmax_2_95, ` +
    "softmax_2_95:2 or module=h.2.attn); the page opened at its start.";
  setStatus(`#${hash}: not in this history`, true);
  ui.panel.innerHTML = `<p class="error" id="torchlog-unknown-hash">${esc(text)}</p>`;
}
