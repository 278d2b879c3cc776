// Layout off the main thread. Graphviz runs in a worker made from the page's own copy of it
// (the inline script's text), so laying out hundreds of nodes never freezes the page and can
// be cancelled; small graphs (under WORKER_NODES) are laid out here, where no message has to
// travel. Where no worker can be made (a sandboxed notebook frame may refuse blob URLs), every
// layout runs here, as before.
const WORKER_NODES = 150;
// Above this many nodes "draw anyway" is not offered: Graphviz's recursion overflows the
// stack on long chains (a 10,000-node chain failed in Chromium, an 8,000-node one drew).
const MAX_FORCED = 6000;
const layouts = { worker: null, failed: false, next: 0, pending: new Map() };

class LayoutCancelled extends Error {}

function workerMain() {
  const ready = globalThis.torchlogGraphviz.Graphviz.load();
  self.onmessage = async (ev) => {
    const gv = await ready;
    try {
      self.postMessage({ id: ev.data.id, svg: gv.layout(ev.data.dot, "svg", "dot") });
    } catch (err) {
      self.postMessage({ id: ev.data.id, error: String((err && err.message) || err) });
    }
  };
}

function layoutWorker() {
  if (layouts.worker || layouts.failed) return layouts.worker;
  try {
    const source = el("torchlog-graphviz").textContent + "\n(" + workerMain.toString() + ")();\n";
    const worker = new Worker(URL.createObjectURL(new Blob([source], { type: "text/javascript" })));
    worker.onmessage = (ev) => {
      const job = layouts.pending.get(ev.data.id);
      layouts.pending.delete(ev.data.id);
      if (!job) return;
      if (ev.data.error !== undefined) job.reject(new Error(ev.data.error)); else job.resolve(ev.data.svg);
    };
    worker.onerror = (ev) => {
      ev.preventDefault();
      onWorkerError(ev.message || "unknown error");
    };
    layouts.worker = worker;
  } catch (err) {
    layouts.failed = true;  // no worker here: lay out on the main thread
  }
  return layouts.worker;
}

// A worker that could not start (a frame whose origin may not run a blob URL's script) or
// broke: from now on layouts run here, the waiting ones first.
function onWorkerError(message) {
  const waiting = [...layouts.pending.values()];
  layouts.pending.clear();
  if (layouts.worker) layouts.worker.terminate();
  layouts.worker = null;
  layouts.failed = true;
  layouts.inWorker = false;
  for (const job of waiting) {
    try {
      job.resolve(graphviz.layout(job.dot, "svg", "dot"));
    } catch (err) {
      job.reject(new Error(`${err.message} (the layout worker had failed too: ${message})`));
    }
  }
}

function stopWorker(reason) {
  if (layouts.worker) layouts.worker.terminate();
  layouts.worker = null;
  for (const job of layouts.pending.values()) job.reject(reason);
  layouts.pending.clear();
}

// The SVG text of `dot` (`nodes` of them): in the worker, with progress and a cancel button.
async function layoutSvg(dot, nodes) {
  const worker = nodes >= WORKER_NODES ? layoutWorker() : null;
  layouts.inWorker = Boolean(worker);
  if (!worker) return graphviz.layout(dot, "svg", "dot");
  const id = ++layouts.next;
  const started = performance.now();
  const cancel = el("torchlog-cancel");
  const tick = setInterval(() => {
    cancel.hidden = false;
    setStatus(`laying out ${nodes} nodes\u2026 ${((performance.now() - started) / 1000).toFixed(0)} s`);
  }, 250);
  try {
    return await new Promise((resolve, reject) => {
      layouts.pending.set(id, { resolve, reject, dot });
      worker.postMessage({ id, dot });
    });
  } finally {
    clearInterval(tick);
    cancel.hidden = true;
  }
}

function cancelLayout() {
  stopWorker(new LayoutCancelled("layout cancelled"));
}
