"""Tutorial 3: a hand-written RNN cell stepped in a loop, its history and its rolled view.

Run it with `python tutorials/03_recurrence.py` (a second or two on a CPU). You will see:

1. how the passes of a loop fold into one layer with `:k` pass labels;
2. the rolled view: one record per layer, with which passes each edge connects;
3. the module side: a module called k times has k passes, `history['cell:3']`;
4. that parameter-free loops fold too, while look-alike code that is not a loop does not.

The test suite runs this file, so every assertion below is checked on every commit.
"""
import torch
from torch import nn

import torchlog


class ElmanCell(nn.Module):
    """h' = tanh(W_x x + W_h h): the classic recurrent cell, written by hand."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.in_proj = nn.Linear(input_size, hidden_size)
        self.hidden_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.in_proj(x) + self.hidden_proj(h))


class SequenceModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = ElmanCell(3, 8)
        self.head = nn.Linear(8, 2)

    def forward(self, seq: torch.Tensor) -> torch.Tensor:
        h = torch.zeros(seq.shape[1], 8)
        for t in range(seq.shape[0]):  # the same cell, stepped once per time step
            h = self.cell(seq[t], h)
        return self.head(h)


torch.manual_seed(0)
model = SequenceModel()
sequence = torch.randn(5, 2, 3)  # 5 time steps, batch of 2, 3 features
history = torchlog.log_forward_pass(model, sequence, random_seed=0)

# ---------------------------------------------------------------------------------------
# 1. Passes: the summary says the model is recurrent, and each step is one pass
# ---------------------------------------------------------------------------------------
print("\n".join(history.summary().splitlines()[:2]))
print("\nThe unrolled list (one entry per op execution):")
print("   ", ", ".join(history.layer_labels[:9]), "...")
assert history.is_recurrent and history.max_passes == 5

# The input projection ran 5 times with the same weights: one layer, passes :1..:5.
step3 = history["linear_1_3:3"]
print(f"\n{step3.label}: pass {step3.pass_num} of {step3.num_passes}, "
      f"parents {step3.parent_labels}")
print(str(step3).splitlines()[0])  # the layer printout says 'pass 3 of 5'
assert "(pass 3 of 5)" in str(step3)

# ---------------------------------------------------------------------------------------
# 2. The rolled view: each layer once, edges say which passes they connect
# ---------------------------------------------------------------------------------------
print("\nRolled layers:")
for layer in history.layers:
    print(f"    {layer.label:<14} x{layer.num_passes}")
tanh = history.layer("tanh_1_6")
recurrent_edge = tanh.child_layers["linear_2_4"]  # h feeds the next step's hidden projection
print(f"\ntanh passes {recurrent_edge.parent_passes} feed linear_2_4 passes "
      f"{recurrent_edge.child_passes}")
assert recurrent_edge.parent_passes == (1, 2, 3, 4)
assert recurrent_edge.child_passes == (2, 3, 4, 5)
print(tanh)  # the rolled record printed: passes and edge spans

# The activations of every step, for analysis: stack the five hidden states.
hidden_states = torch.stack(tanh.tensor_contents)
print(f"\nhidden states of all steps: {tuple(hidden_states.shape)}, "
      f"norms {[round(n, 3) for n in hidden_states.norm(dim=(1, 2)).tolist()]}")

# ---------------------------------------------------------------------------------------
# 3. Modules: the cell was called 5 times, so it has 5 passes
# ---------------------------------------------------------------------------------------
cell = history.modules["cell"]
print(f"\nmodule 'cell' ({cell.type_name}) ran {cell.num_passes} times")
third_call = history["cell:3"]
print(f"history['cell:3'] is {third_call.label}, the output of the cell's 3rd call")
assert third_call is history["tanh_1_6:3"]
# The same tensor a plain forward hook would have seen on the third call:
seen = []
handle = model.cell.register_forward_hook(lambda m, i, o: seen.append(o.detach().clone()))
model(sequence)
handle.remove()
assert torch.equal(seen[2], third_call.tensor_contents)

# ---------------------------------------------------------------------------------------
# 4. Loops without parameters fold as well; look-alikes that are not loops do not
# ---------------------------------------------------------------------------------------


class Refine(nn.Module):
    def forward(self, x):
        for _ in range(3):
            x = torch.sin(x) * 2
        return x


class ThreeInputs(nn.Module):
    def forward(self, a, b, c):  # the same ops on three inputs: parallel, not a loop
        return torch.sin(a) * 2 + torch.sin(b) * 2 + torch.sin(c) * 2


refine = torchlog.log_forward_pass(Refine(), torch.rand(4))
parallel = torchlog.log_forward_pass(ThreeInputs(), [torch.rand(4) for _ in range(3)])
print("\nloop:    ", refine.layer_labels)
print("parallel:", parallel.layer_labels)
assert [layer.num_passes for layer in refine.layers] == [1, 3, 3, 1]
assert all(layer.num_passes == 1 for layer in parallel.layers)
