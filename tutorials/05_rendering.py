"""Tutorial 5: draw a forward pass as a graph, unrolled, rolled and depth-limited.

Run it with `python tutorials/05_rendering.py`; it takes a few seconds on a CPU, downloads
nothing and writes its pictures to a temporary folder (it prints where). You will:

1. log a small GPT-2 and draw every op (the unrolled view);
2. fold a loop into one node per layer (the rolled view) and read its pass labels;
3. draw only the top levels of the module tree (depth-limited views);
4. pick direction, file format and buffers, and render straight from log_forward_pass;
5. get the DOT source, which needs no graphviz at all.

In Jupyter, the value `render_graph` returns displays as the picture itself; in a script
it is the path of the file written. The test suite runs this file.
"""
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn
from transformers import GPT2Config, GPT2Model
from transformers.utils import logging as hf_logging

import torchlog

hf_logging.set_verbosity_error()
torch.manual_seed(0)
OUT = Path(tempfile.mkdtemp(prefix="torchlog_rendering_"))
# Pictures need graphviz's `dot` program (apt-get install graphviz). Without it we write
# the DOT source instead ('gv'), which any graphviz viewer opens later.
FORMAT = "svg" if shutil.which("dot") else "gv"
print(f"Writing {FORMAT} files to {OUT}")

# ---------------------------------------------------------------------------------------
# 1. The unrolled view: one node per op
# ---------------------------------------------------------------------------------------
# A real GPT-2 architecture from a tiny config: 2 blocks, hidden size 32, random weights.
config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                    bos_token_id=0, eos_token_id=0)
gpt2 = GPT2Model(config).eval()
tokens = torch.randint(0, config.vocab_size, (1, 8))
history = torchlog.log_forward_pass(gpt2, tokens, input_kwargs={"use_cache": False},
                                    layers_to_save=None)  # drawing needs no activations

path = history.render_graph(outpath=OUT / "gpt2_unrolled", fileformat=FORMAT)
print(f"\n1. {len(history)} ops drawn to {Path(path).name}")
# Each node shows its label, output shape and size, and the shapes of the parameters it
# used. Colours tell inputs (green), outputs (red), parameter ops (grey), tensors made
# inside forward (blue, rounded) and collapsed modules (lilac, 3-D) apart; in-place ops
# get a double border. Modules are nested boxes titled `address (Type)`.
print("   the DOT text is kept beside the file:", path.source.splitlines()[0])
assert Path(path).exists() and 'cluster_h.0:1' in path.source


# ---------------------------------------------------------------------------------------
# 2. The rolled view: one node per layer
# ---------------------------------------------------------------------------------------
# A loop runs the same ops again; torchlog groups the repeats into one layer with several
# passes. Unrolled, this model has 4 x 3 op nodes; rolled, it has one node per layer.
class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(5, 5)

    def forward(self, x):
        for _ in range(4):
            x = self.fc(x)
            x = x + 1
            x = x * 2
        return x


loop_history = torchlog.log_forward_pass(Recurrent(), torch.rand(6, 5))
rolled = loop_history.render_graph(mode="rolled", outpath=OUT / "loop_rolled", fileformat=FORMAT)
print(f"\n2. rolled loop drawn to {Path(rolled).name}")
# `(x4)` says a layer ran four times. An edge that carries only some passes says which:
# mul's output feeds the Linear layer back after passes 1-3 ('Out 1-3'), and the Linear
# layer reads it in passes 2-4 ('In 2-4'); pass 1 reads the input ('In 1').
for line in rolled.source.splitlines():
    if "->" in line and ("In " in line or "Out " in line):
        print("  ", line.strip())
assert '"linear_1_1" [label="linear_1_1 (x4)' in rolled.source
assert 'taillabel="Out 1-3", headlabel="In 2-4"' in rolled.source

# ---------------------------------------------------------------------------------------
# 3. Depth-limited views: modules below a depth become one node each
# ---------------------------------------------------------------------------------------
# nesting_depth=1 keeps only the top-level modules; 2 opens those and collapses the next
# level. A collapsed module shows its type, output shape and parameter count.
for depth in (1, 2):
    limited = history.render_graph(nesting_depth=depth, outpath=OUT / f"gpt2_depth{depth}",
                                   fileformat=FORMAT)
    modules = [line.split('"')[1] for line in limited.source.splitlines() if '"module ' in line
               and "->" not in line]
    print(f"\n3. depth {depth}: {len(modules)} collapsed modules, e.g. {modules[:4]}")
assert "module h.0.attn:1" in limited.source  # at depth 2 the attention block is one node

# ---------------------------------------------------------------------------------------
# 4. Direction, buffers, and rendering while logging
# ---------------------------------------------------------------------------------------
# Graphs grow bottom-up by default; 'topdown' and 'leftright' are the alternatives.
# Buffers (BatchNorm's running statistics, say) are hidden unless show_buffers=True.
net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU()).eval()
drawn = torchlog.log_forward_pass(net, torch.rand(3, 4), vis_opt="unrolled",
                                  vis_direction="leftright", vis_show_buffers=True,
                                  vis_outpath=str(OUT / "with_buffers"), vis_fileformat=FORMAT)
print(f"\n4. log_forward_pass(..., vis_opt='unrolled') returned {drawn!r}")
print("   and wrote", sorted(p.name for p in OUT.glob("with_buffers*")))
assert "1.running_mean" in drawn.to_dot(show_buffers=True)
assert "running_mean" not in drawn.to_dot()

# ---------------------------------------------------------------------------------------
# 5. The DOT source, with or without graphviz
# ---------------------------------------------------------------------------------------
# to_dot() builds the text without graphviz and is byte-identical for the same model and
# input, so it diffs well in code review. Without `dot`, render_graph raises
# MissingDependencyError saying how to install it; to_dot() still works.
source = history.to_dot(mode="rolled", nesting_depth=2)
print(f"\n5. DOT source of the depth-2 view: {len(source.splitlines())} lines; first three:")
print("\n".join("   " + line[:100] for line in source.splitlines()[:3]))
assert source == history.to_dot(mode="rolled", nesting_depth=2)
