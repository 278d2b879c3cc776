// Why the viewer lays graphs out with Graphviz (WebAssembly) and not ELK: both on the same
// graphs, in one Node.js process.
//
//   npm pack elkjs@0.12.1 && tar xzf elkjs-0.12.1.tgz        # ELK is not vendored; fetch it to compare
//   node bench/viewer_layout_choice.js package/lib/elk.bundled.js
//
// Graphs: a chain of N ops (a long unrolled loop), and a transformer-like nest of 12 blocks x
// 3 modules x 12 ops (432 ops in 36 boxes, with skip edges), every edge labelled with a shape.
"use strict";
const path = require("path");

require(path.join(__dirname, "..", "vis", "viewer", "vendor", "graphviz.js"));  // sets globalThis.torchlogGraphviz
const ELK = require(path.resolve(process.argv[2]));

function chainDot(n) {
  let s = "digraph G { node[shape=box];\n";
  for (let i = 1; i < n; i++) s += `n${i - 1} -> n${i} [label="(1, 8)"];\n`;
  return s + "}";
}

function nestedDot(blocks, ops) {
  let s = "digraph G { node[shape=box];\n";
  const edges = [];
  let prev = null;
  for (let b = 0; b < blocks; b++) {
    s += `subgraph cluster_b${b} { label="block ${b}";\n`;
    for (let m = 0; m < 3; m++) {
      s += `subgraph cluster_b${b}m${m} { label="module ${m}";\n`;
      for (let o = 0; o < ops; o++) {
        const id = `b${b}m${m}o${o}`;
        s += `${id};\n`;
        if (prev) edges.push(`${prev} -> ${id} [label="(1, 128, 256)"];`);
        if (o % 3 === 0 && prev) edges.push(`b${b}m0o0 -> ${id};`);
        prev = id;
      }
      s += "}\n";
    }
    s += "}\n";
  }
  return s + edges.join("\n") + "}";
}

function chainElk(n) {
  const children = [], edges = [];
  for (let i = 0; i < n; i++) {
    children.push({ id: "n" + i, width: 120, height: 40 });
    if (i) edges.push({ id: "e" + i, sources: ["n" + (i - 1)], targets: ["n" + i], labels: [{ text: "(1, 8)", width: 30, height: 10 }] });
  }
  return { id: "root", layoutOptions: { "elk.algorithm": "layered", "elk.direction": "DOWN" }, children, edges };
}

function nestedElk(blocks, ops) {
  const root = { id: "root", layoutOptions: { "elk.algorithm": "layered", "elk.direction": "DOWN",
    "elk.hierarchyHandling": "INCLUDE_CHILDREN" }, children: [], edges: [] };
  let prev = null;
  for (let b = 0; b < blocks; b++) {
    const block = { id: `b${b}`, children: [] };
    for (let m = 0; m < 3; m++) {
      const mod = { id: `b${b}m${m}`, children: [] };
      for (let o = 0; o < ops; o++) {
        const id = `b${b}m${m}o${o}`;
        mod.children.push({ id, width: 120, height: 40 });
        const label = [{ text: "(1, 128, 256)", width: 60, height: 10 }];
        if (prev) root.edges.push({ id: "e" + root.edges.length, sources: [prev], targets: [id], labels: label });
        if (o % 3 === 0 && prev) root.edges.push({ id: "e" + root.edges.length, sources: [`b${b}m0o0`], targets: [id] });
        prev = id;
      }
      block.children.push(mod);
    }
    root.children.push(block);
  }
  return root;
}

async function main() {
  const gv = await globalThis.torchlogGraphviz.Graphviz.load();
  const elk = new ELK();
  await elk.layout(chainElk(50));  // warm both up
  gv.layout(chainDot(50), "svg", "dot");
  const cases = [["chain of 500 ops", () => chainDot(500), () => chainElk(500)],
                 ["chain of 2,000 ops", () => chainDot(2000), () => chainElk(2000)],
                 ["12 blocks x 3 modules x 12 ops", () => nestedDot(12, 12), () => nestedElk(12, 12)]];
  for (const [name, dot, elkGraph] of cases) {
    let t = performance.now();
    gv.layout(dot(), "svg", "dot");
    const gvMs = performance.now() - t;
    t = performance.now();
    let elkText;
    try { await elk.layout(elkGraph()); elkText = (performance.now() - t).toFixed(0) + " ms"; } catch (e) { elkText = "failed: " + e.message; }
    console.log(`${name}: graphviz-wasm ${gvMs.toFixed(0)} ms (layout + SVG), elkjs ${elkText} (layout only)`);
  }
}
main();
