"""Tutorial 7: checking a log by replay, and saving the gradient of every layer.

Run it with `python tutorials/07_validation_and_gradients.py`; it takes a few seconds on a CPU.
You will:

1. check that torchlog logged a model correctly with `validate_saved_activations`;
2. see what a wrong log looks like: corrupt a saved activation and a parent link and let
   `find_replay_problems` point at them;
3. log gradients with `save_gradients=True`, call backward, and read `grad_contents`
   for each pass of a layer that runs several times;
4. call backward from an intermediate layer instead of the output;
5. see the warning you get when no gradient can exist.

The test suite runs this file, so every claim below is checked on every commit.
"""
import warnings

import torch
from torch import nn

import torchlog
from torchlog.records import ParentEdge
from torchlog.validation import find_replay_problems


# ---------------------------------------------------------------------------------------
# 1. Validating a log
# ---------------------------------------------------------------------------------------
# A small recurrent model: one Linear applied three times, with an in-place ReLU and
# dropout, so the log has repeated layers, an in-place op and a random op.
class Refiner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(6, 6)
        self.drop = nn.Dropout(0.2)
        self.head = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.relu_(self.cell(x)) + x
        return self.head(self.drop(x))


torch.manual_seed(0)
model = Refiner()
x = torch.randn(4, 6)

# validate_saved_activations runs the model plainly and logged (same seed), then re-runs
# every logged op on the saved values of its parents and compares with what was saved.
# It also replaces each parent's values and checks that the op's output moves.
ok = torchlog.validate_saved_activations(model, x, random_seed=0, verbose=True)
print("log is valid:", ok)
assert ok

# ---------------------------------------------------------------------------------------
# 2. What a wrong log looks like
# ---------------------------------------------------------------------------------------
# Replay needs each op's function and arguments and the RNG state before it. Ordinary
# logging skips them (it stays fast); ask for them with save_function_args=True.
history = torchlog.log_forward_pass(model, x, save_function_args=True, random_seed=0)
print("\nproblems in a fresh log:", find_replay_problems(history).problems)

# Corrupt one saved activation: the second pass of the Linear.
second = history["cell:2"]
original = second.saved
second.saved = original + 0.5
for problem in find_replay_problems(history).problems:
    print("  ", problem)
# The corrupted pass fails its own replay, and so does the op that read it.
assert {p.label for p in find_replay_problems(history).problems} == {second.label, *second.children}
second.saved = original  # undo

# Corrupt a parent link: say the first ReLU read the *second* Linear's output.
relu = next(p for p in history if p.layer_type == "relu")
original_parents = relu.parents
relu.parents = (ParentEdge(second.label, 0),)
problems = find_replay_problems(history).problems
print(f"\nwith {relu.label} wired to {second.label}:")
for problem in problems:
    print("  ", problem)
assert problems and problems[0].label == relu.label and problems[0].check == "replay"
relu.parents = original_parents

# ---------------------------------------------------------------------------------------
# 3. Gradients of every layer
# ---------------------------------------------------------------------------------------
# save_gradients=True hooks every logged tensor that requires grad. Saved tensors stay in
# the autograd graph (they are clones of the live tensors), so a loss computed from the
# saved output can be backpropagated; each hook files its gradient in its pass's record.
history = torchlog.log_forward_pass(model, x, save_gradients=True, random_seed=0)
output = history[history.output_layers[0]].tensor_contents
loss = output.pow(2).sum()
history.log_backward(loss)  # the same as loss.backward()

print("\npasses with gradients:", history.layers_with_grads)
cell = history.layer("cell")
for record in cell.passes:  # each pass of the repeated Linear has its own gradient
    print(f"  {record.label}: |grad| = {record.grad_contents.norm():.4f}")

# Check one against autograd on a plain run: the same forward written out.
with torchlog.seeding.seeded(0):
    h = x
    firsts = []
    for _ in range(3):
        lin = model.cell(h)
        firsts.append(lin)
        h = torch.relu(lin) + h  # relu_ on `lin` would hide the pre-ReLU value from autograd
    plain_loss = model.head(model.drop(h)).pow(2).sum()
# relu_ overwrote the Linear's output, so its gradient is taken w.r.t. the ReLU's input.
expected = torch.autograd.grad(plain_loss, firsts)
for record, grad in zip(cell.passes, expected):
    torch.testing.assert_close(record.grad_contents, grad)
print("gradients match torch.autograd.grad")

# ---------------------------------------------------------------------------------------
# 4. Backward from an intermediate layer
# ---------------------------------------------------------------------------------------
history = torchlog.log_forward_pass(model, x, save_gradients=True, random_seed=0)
middle = history["cell:2"]
middle.tensor_contents.sum().backward()
print("\nbackward from", middle.label, "reaches:", history.layers_with_grads)
assert history["head"].grad_contents is None  # nothing computed after cell:2 gets one
assert history["cell:1"].grad_contents is not None

# ---------------------------------------------------------------------------------------
# 5. When no gradient can exist
# ---------------------------------------------------------------------------------------
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with torch.no_grad():
        torchlog.log_forward_pass(model, x, save_gradients=True)
print("\nunder torch.no_grad():", caught[0].message)
assert "no_grad" in str(caught[0].message)
