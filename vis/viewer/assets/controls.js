// Export as SVG or PNG, the toolbar, and start-up.
// ----- export -------------------------------------------------------------------------------------
function currentSvgText() {
  const svg = state.drawn.svg.cloneNode(true);
  svg.querySelectorAll(".torchlog-short").forEach((t) => t.remove());  // the zoomed-out titles
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
  fitReadable();
}

// Open (or fold again) every helper run and fold of ops outside the modules.
async function setPlumbing(show) {
  state.showPlumbing = Boolean(show);
  for (const key of moduleDepth[state.mode].keys()) {
    if (!isPlumbing(key)) continue;
    if (state.showPlumbing) state.expanded.add(key); else state.expanded.delete(key);
  }
  await render(state.showPlumbing ? "show plumbing" : "fold plumbing");
  fitReadable();
}

async function setMode(mode) {
  state.mode = mode;
  state.selected = null;
  state.forceDraw = false;
  expandToDepth();
  await render("mode " + mode);
  fitReadable();
}

function installControls() {
  ui.mode.onchange = () => setMode(ui.mode.value);
  ui.depth.onchange = () => setDepth(parseInt(ui.depth.value, 10) || 1);
  el("torchlog-expand-all").onclick = () => setDepth(maxDepth + 1);
  el("torchlog-collapse-all").onclick = () => setDepth(1);
  ui.direction.onchange = async () => { state.direction = ui.direction.value; await render("direction"); fitReadable(); };
  ui.buffers.onchange = async () => { state.showBuffers = ui.buffers.checked; await render("buffers"); fitReadable(); };
  ui.plumbing.onchange = () => setPlumbing(ui.plumbing.checked);
  ui.repeats.onchange = () => setRepeats(ui.repeats.checked);
  el("torchlog-fit").onclick = () => fit();
  el("torchlog-cancel").onclick = cancelLayout;
  el("torchlog-export-svg").onclick = exportSvg;
  el("torchlog-export-png").onclick = exportPng;
  ui.search.addEventListener("keydown", (ev) => { if (ev.key === "Enter") { ev.preventDefault(); runSearch(); } });
  // `change` also fires when the box loses focus: search only for new text (a suggestion
  // picked from the list), never step to the next match of the text Enter already found.
  ui.search.addEventListener("change", () => {
    if (ui.search.value && ui.search.value !== lastSearch.text) runSearch();
  });
  ui.graph.addEventListener("click", onClick);
  document.addEventListener("keydown", onKey);
  ui.panel.addEventListener("click", onPanelClick);
  window.addEventListener("resize", () => { if (state.drawn && (state.view || state.pendingFit)) fitReadable(); });
  installPanZoom();
  installOverview();
  installResults();
  installColours();
  installCharts();
}

const OPEN_MIN_NODES = 8;

// Resolves once the graph area has a size (at once when it has one).
function whenSized() {
  if (graphArea()) return Promise.resolve();
  return new Promise((resolve) => {
    const watch = new ResizeObserver(() => { if (graphArea()) { watch.disconnect(); resolve(); } });
    watch.observe(ui.graph);
  });
}

// Without a depth asked for, collapse a level at a time until the whole graph fits the window
// with every module's title readable, but never down to a handful of nodes (a model whose
// one wrapper module holds everything); fitReadable then scrolls what still does not fit.
async function pickReadableDepth() {
  while (state.depth > 1 && fitScale() < Math.min(1.5, readableScale())) {
    state.depth -= 1;
    expandToDepth();
    if (placement().units.size < OPEN_MIN_NODES) {
      state.depth += 1;
      expandToDepth();
      break;
    }
    await render("open at depth " + state.depth);
  }
  if (fitScale() < Math.min(1.5, readableScale()) && !state.foldRepeats) {
    state.foldRepeats = true;  // still too long to read whole: fold repeated blocks, if any
    await render("open with repeats folded");
    if (!state.drawn.placed.units.size || ![...state.drawn.placed.units.values()].some((u) => u.kind === "repeat")) {
      state.foldRepeats = false;
      await render("open: no repeats to fold");
    }
  }
}

async function start() {
  // Milliseconds since navigation started, per phase (the benchmark reports them).
  const phases = window.torchlogViewer.phases = { script: performance.now() };
  const loading = window.torchlogGraphviz.Graphviz.load();  // compiles while the rest sets up
  installControls();
  expandToDepth();
  syncControls();
  showPath(null);
  if (!DATA.passes.length) { setStatus("this history has no ops", true); return; }
  setStatus("loading Graphviz\u2026");
  graphviz = await loading;
  phases.graphviz = performance.now();
  await render("open");
  if (!graphArea()) {
    setStatus("waiting for the page to be shown (it has no size yet)");
    await whenSized();
    setStatus(state.drawnStatus);
  }
  if (DATA.view.pickDepth && !DATA.view.focus) await pickReadableDepth();
  fitReadable();
  if (DATA.view.focus) await goTo(DATA.view.focus);
  else if (await openFromHash()) setStatus("opened at " + location.hash);
  else if (DATA.failure) select(FAILED_KEY);
  if (!DATA.numSaved && !location.hash && !DATA.failure) ui.panel.innerHTML = `<p class="no-values">${esc(NO_VALUES_TEXT)}</p>`;
  window.torchlogViewer.openedMs = phases.drawn = performance.now();
  document.body.dataset.ready = "true";
  setTimeout(fillSearchList, 0);  // suggestions can wait until the graph is on screen
  setTimeout(layoutWorker, 0);  // ready for a large layout (Expand all) before it is asked for
}

Object.assign(window.torchlogViewer, { cancelLayout, setRepeats, unfoldRun, runSearch, svgText: currentSvgText, pngDataUrl, fit, zoomBy, setPlumbing,
  setColour, scale: currentScale });
window.torchlogViewer.ready = start().catch((err) => {
  setStatus("could not draw the graph: " + err.message, true);
  document.body.dataset.ready = "error";
  throw err;
});
