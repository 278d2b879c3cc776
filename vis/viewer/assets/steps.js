// The viewer of a generation: a step control around one step's viewer page (in a frame), the
// step's tokens, and a site's statistics over the steps, drawn by charts.js's passesChartSvg.
const DATA = JSON.parse(document.getElementById("torchlog-generation").textContent);
const el = (id) => document.getElementById(id);
const ui = {
  frame: el("torchlog-step-frame"), step: el("torchlog-step"), prev: el("torchlog-step-prev"),
  next: el("torchlog-step-next"), tokens: el("torchlog-step-tokens"), site: el("torchlog-site"),
  panel: el("torchlog-panel"), status: el("torchlog-steps-status"),
};
const state = {
  step: null,         // the step shown
  site: null,         // the site plotted over the steps
  series: null,       // its figures, one entry per step
  loads: 0,           // step pages asked for: a late page of an earlier ask is left alone
  picked: null,       // the frame's selection last taken as the site
  histLog: false,     // read by charts.js
};
const ABSENT = "not at this step";
const PICK_TEXT = "Type a site (a module address such as transformer.h.0, or a label) above, or click a " +
  "node in the graph, to plot its statistics over the steps.";
let framePage = null;  // the viewer page around a step's data, split where the data goes

function setStatus(text, isError) {
  ui.status.textContent = text;
  ui.status.classList.toggle("error", Boolean(isError));
}

function stepLabel(k) {
  return k === 0 ? "0 (prefill)" : String(k);
}

// ----- tokens ---------------------------------------------------------------------------------
function tokensPart(found, word) {
  if (!found) return `<b>${word}</b> \u2013`;
  const seqs = found.ids.map((ids, i) => {
    const more = found.length > ids.length ? `\u2026${found.length - ids.length} more ` : "";
    const text = found.text ? ` "${esc(found.text[i])}"` : "";
    return more + ids.join(" ") + text;
  });
  const extra = found.sequences > found.ids.length ? ` (+${found.sequences - found.ids.length} sequences)` : "";
  return `<b>${word}</b> <span data-part="${word}">${seqs.join(" | ")}</span>${extra}`;
}

function tokensHtml(entry) {
  const why = DATA.partial ? "generation raised" : "not one per sequence: beam search";
  const chosen = entry.chosen ? tokensPart(entry.chosen, "chose") : `<b>chose</b> \u2013 <small>(${why})</small>`;
  return `<b>${esc(entry.name)}</b> ` + tokensPart(entry.read, "read") + " " + chosen;
}

// ----- the URL hash: #step=3&site=transformer.h.1 -----------------------------------------------
function readHash() {
  const params = new URLSearchParams(location.hash.slice(1));
  const raw = params.get("step"), n = DATA.steps.length;
  let step = DATA.start, error = null;
  if (raw !== null) {
    const k = /^\s*-?\d+\s*$/.test(raw) ? Number(raw) : NaN;
    if (Number.isInteger(k) && k >= -n && k < n) step = (k + n) % n;
    else error = `The link's step=${raw} is not a step of this generation: it ran ${n} step${n > 1 ? "s" : ""} ` +
      `(0-${n - 1}; 0 is the prefill, negative counts from the end). Showing step ${stepLabel(DATA.start)}.`;
  }
  return { step, site: params.get("site"), error };
}

function writeHash() {
  const params = new URLSearchParams();
  params.set("step", String(state.step));
  if (state.site) params.set("site", state.site);
  try {
    history.replaceState(null, "", "#" + params.toString());
  } catch (err) {  // a srcdoc frame may refuse: the step then stays unshared
    return;
  }
}

// ----- one step's page in the frame -------------------------------------------------------------
function frameHtml(k) {
  if (!framePage) framePage = JSON.parse(el("torchlog-step-page").textContent).split('"torchlog-step-data"');
  return framePage[0] + el(`torchlog-step-${k}`).textContent + framePage[1];
}

// The frame's viewer, once its first drawing is done (null for a frame it cannot reach).
async function frameViewer() {
  try {
    const viewer = ui.frame.contentWindow.torchlogViewer;
    if (viewer && viewer.ready) await viewer.ready;
    return viewer || null;
  } catch (err) {
    return null;
  }
}

async function openStep(k) {
  const ticket = ++state.loads;
  state.step = k;
  ui.step.value = String(k);
  ui.prev.disabled = k === 0;
  ui.next.disabled = k === DATA.steps.length - 1;
  ui.tokens.innerHTML = tokensHtml(DATA.steps[k]);
  document.body.dataset.step = String(k);
  delete document.body.dataset.stepReady;
  writeHash();
  markStep();
  const loaded = new Promise((resolve) => ui.frame.addEventListener("load", resolve, { once: true }));
  if (DATA.served) ui.frame.src = `step/${k}`; else ui.frame.srcdoc = frameHtml(k);
  await loaded;
  const viewer = await frameViewer();
  if (ticket !== state.loads) return;
  watchFrame();
  const label = state.series && state.series.labels[k];
  if (viewer && label) await viewer.goTo(label);
  document.body.dataset.stepReady = String(k);
}

function stepBy(delta) {
  const k = state.step + delta;
  if (k >= 0 && k < DATA.steps.length) openStep(k);
}

// A click on a node in the step's graph plots that node over the steps; [ and ] step.
function watchFrame() {
  let doc;
  try {
    doc = ui.frame.contentDocument;
  } catch (err) {
    return;  // a frame of another origin: sites are typed only
  }
  if (!doc) return;
  doc.addEventListener("click", () => setTimeout(pickFromFrame, 0));
  doc.addEventListener("keydown", onKey);
}

function pickFromFrame() {
  const viewer = ui.frame.contentWindow.torchlogViewer;
  const key = viewer && viewer.state.selected;
  if (!key || key === state.picked) return;
  state.picked = key;
  // A collapsed module's key is 'module h.0:1'; its first call is its address.
  const site = key.startsWith("module ") ? key.slice("module ".length).replace(/:1$/, "") : key;
  if (site !== "failed op") showSite(site);
}

function onKey(ev) {
  const target = ev.target;
  if (target && (target.tagName === "INPUT" || target.tagName === "SELECT" || target.tagName === "TEXTAREA")) return;
  if (ev.key === "[") stepBy(-1);
  else if (ev.key === "]") stepBy(1);
}

// ----- a site over the steps --------------------------------------------------------------------
async function siteSeries(site) {
  if (DATA.served) {
    const answer = await fetch("site?key=" + encodeURIComponent(site));
    const found = await answer.json();
    return answer.ok ? found : { error: found.error };
  }
  const labels = DATA.where[site];
  if (!labels) {
    return { error: `Site ${JSON.stringify(site)} is at no step of this generation as this page knows it ` +
      "(module addresses and labels; pick one from the list, or serve the generation to look up any key)." };
  }
  return { site, labels, stats: labels.map((label, k) => (label === null ? ABSENT : DATA.stats[k][label])) };
}

async function showSite(text) {
  const site = (text || "").trim();
  if (!site) {
    state.site = state.series = null;
    ui.panel.innerHTML = `<p class="legend">${esc(PICK_TEXT)}</p>`;
    writeHash();
    return;
  }
  const series = await siteSeries(site);
  if (series.error) {
    ui.panel.innerHTML = `<p class="error" id="torchlog-site-error">${esc(series.error)}</p>` +
      `<p class="legend">${esc(PICK_TEXT)}</p>`;
    setStatus(`site ${site}: not found`, true);
    return;
  }
  state.site = site;
  state.series = series;
  ui.site.value = site;
  writeHash();
  drawSeries(series);
  document.body.dataset.site = site;
}

function drawSeries(series) {
  const points = series.stats.map((s, k) => ({ pass: k, stats: s && typeof s === "object" ? s : null }));
  const chart = passesChartSvg(points, "step");
  const legend = '<p class="legend">mean (line), mean \u00b1 std (band), min and max (dots); step 0 is the prefill</p>';
  const labels = [...new Set(series.labels.filter((l) => l !== null))];
  const names = labels.length === 1 ? `${esc(labels[0])} at every step that has it` : labels.map(esc).join(", ");
  const head = "<tr><td>step</td><td>mean</td><td>std</td><td>min</td><td>max</td></tr>";
  const body = series.stats.map((s, k) => {
    const cells = s && typeof s === "object" ? [s.mean, s.std, s.min, s.max].map((v) => `<td>${num(v)}</td>`).join("") :
      `<td colspan="4">${esc(s)}</td>`;
    const title = series.labels[k] === null ? "" : ` title="${esc(series.labels[k])}"`;
    return `<tr data-step="${k}"${title}><td><a data-step="${k}">${esc(stepLabel(k))}</a></td>${cells}</tr>`;
  }).join("");
  ui.panel.innerHTML = `<h2>${esc(series.site)} over the steps</h2>` +
    (labels.length ? `<p class="legend">the pass: ${names}</p>` : "") +
    (chart ? chart + legend : '<p class="legend">fewer than two steps hold a value of it: no chart</p>') +
    `<table class="steps">${head}${body}</table>`;
  markStep();
}

function markStep() {
  for (const row of ui.panel.querySelectorAll("tr[data-step]")) {
    row.classList.toggle("current", Number(row.dataset.step) === state.step);
  }
}

// ----- start-up ---------------------------------------------------------------------------------
function fillControls() {
  ui.step.innerHTML = DATA.steps.map((s, k) => `<option value="${k}">${esc(stepLabel(k))}</option>`).join("");
  const list = el("torchlog-site-list");
  for (const site of DATA.sites.slice(0, 5000)) {
    const option = document.createElement("option");
    option.value = site;
    list.appendChild(option);
  }
  ui.step.onchange = () => openStep(Number(ui.step.value));
  ui.prev.onclick = () => stepBy(-1);
  ui.next.onclick = () => stepBy(1);
  ui.site.addEventListener("change", () => showSite(ui.site.value));
  ui.panel.addEventListener("click", (ev) => {
    const a = ev.target.closest("a[data-step]");
    if (a) openStep(Number(a.dataset.step));
  });
  document.addEventListener("keydown", onKey);
  window.addEventListener("hashchange", fromHash);
}

// Open what the hash names; a step out of range is said in the bar and the first step shown.
async function fromHash() {
  const asked = readHash();
  setStatus("");
  const site = asked.site !== null ? asked.site : state.site || DATA.site;
  if (site !== state.site || !state.series) await showSite(site);
  if (asked.step !== state.step) await openStep(asked.step);
  if (asked.error) setStatus(asked.error, true);
  document.body.dataset.stepError = asked.error ? "true" : "";
}

async function startSteps() {
  fillControls();
  await fromHash();
  document.body.dataset.ready = "true";
}

window.torchlogGeneration = { state, data: DATA, openStep, showSite, stepBy };
// After the whole script has run (panel.js and charts.js define what drawing needs).
window.torchlogGeneration.ready = Promise.resolve().then(startSteps).catch((err) => {
  setStatus("could not open the generation: " + err.message, true);
  document.body.dataset.ready = "error";
  throw err;
});
