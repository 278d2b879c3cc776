"""Tutorial 2: debugging a model that crashes, with the history torchlog keeps.

Run it with `python tutorials/02_debugging_a_broken_model.py`; it takes a second on a CPU.
You will:

1. log a model whose forward pass crashes in `torch.cat`, and read the note torchlog adds
   to the exception;
2. explore `err.torchlog_history`, the partial history of everything that ran before the
   crash, to find the cause;
3. get that partial history back without an exception, with `on_error='return'`;
4. fix the model and check the fix.

The test suite runs this file, so every claim below is checked on every commit.
"""
import torch
from torch import nn

import torchlog


# ---------------------------------------------------------------------------------------
# 1. A model that crashes
# ---------------------------------------------------------------------------------------
# A small two-branch model: one branch encodes a sequence, the other a set of features,
# and `fuse` joins them side by side with torch.cat. The sequence branch pools over time
# with `mean(dim=0)`, a classic slip: dim 0 is the batch, not the time axis.
class Fuse(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(16, 8)

    def forward(self, seq_code: torch.Tensor, feat_code: torch.Tensor) -> torch.Tensor:
        joined = torch.cat([seq_code, feat_code], dim=1)
        return self.proj(joined)


class TwoBranch(nn.Module):
    def __init__(self, pool_dim: int = 0) -> None:
        super().__init__()
        self.seq_encoder = nn.Linear(5, 8)
        self.feat_encoder = nn.Sequential(nn.Linear(3, 8), nn.ReLU())
        self.fuse = Fuse()
        self.pool_dim = pool_dim

    def forward(self, seq: torch.Tensor, feats: torch.Tensor) -> torch.Tensor:
        seq_code = self.seq_encoder(seq).mean(dim=self.pool_dim)  # seq is (batch, time, 5)
        feat_code = self.feat_encoder(feats)
        return self.fuse(seq_code, feat_code)


torch.manual_seed(0)
model = TwoBranch()
seq, feats = torch.rand(4, 10, 5), torch.rand(4, 3)  # a batch of 4

# log_forward_pass gives you the model's own exception: same type, same message, same
# traceback, so `except RuntimeError` in your code keeps working. torchlog only adds a
# note saying which op failed, in which module, and which op was logged last.
try:
    torchlog.log_forward_pass(model, [seq, feats])
except RuntimeError as err:
    error = err
print(f"{type(error).__name__}: {error}")
print(error.__notes__[0])
assert type(error) is RuntimeError and "'cat'" in error.__notes__[0]
assert "module 'fuse'" in error.__notes__[0]

# ---------------------------------------------------------------------------------------
# 2. What ran before the crash
# ---------------------------------------------------------------------------------------
# The exception carries the partial history: every op that finished, with its saved
# output, exactly like a full history. Printing it says where it stopped.
partial = error.torchlog_history
print()
print(partial)
assert partial.is_partial

# `info.failed_parents` names the logged tensors the failing op received. Their shapes
# show the bug at once: the sequence code lost its batch dimension and kept time instead.
print("\ntorch.cat received:")
for label in partial.info.failed_parents:
    record = partial[label]
    print(f"    {label:<12} shape {record.shape}, from module {record.module or '(top level)'}")
seq_code = partial[partial.info.failed_parents[0]]
assert seq_code.shape == (10, 8)  # (time, features): the batch of 4 was averaged away

# Look one step further back: the seq_encoder output still has the batch first, so the
# `mean` that follows it is the culprit.
encoded = partial["seq_encoder"]
print(f"\nseq_encoder returned {encoded.shape}; then {seq_code.func_name}() gave {seq_code.shape}")
assert encoded.shape == (4, 10, 8) and seq_code.parent_labels == (encoded.label,)

# The saved activations of the ops that finished are real values you can inspect.
assert torch.equal(encoded.tensor_contents, model.seq_encoder(seq))
# The history works like any other: as a table too.
table = partial.to_pandas()[["label", "shape", "module"]].fillna({"module": "(top level)"})
print(table.to_string(index=False))

# ---------------------------------------------------------------------------------------
# 3. The partial history without an exception
# ---------------------------------------------------------------------------------------
# In a notebook, or a script that checks many models, you may prefer the history back
# instead of an exception: on_error='return' does that. `info.failure` says what raised.
returned = torchlog.log_forward_pass(model, [seq, feats], on_error="return")
print(f"\non_error='return' gave {returned!r}")
print(f"    it stopped at: {returned.info.failure}")
assert returned.is_partial and returned.layer_labels == partial.layer_labels

# Ctrl-C is different: a KeyboardInterrupt is never swallowed, even with on_error='return',
# and torch and the model are left exactly as they were before the call.

# ---------------------------------------------------------------------------------------
# 4. The fix
# ---------------------------------------------------------------------------------------
fixed = TwoBranch(pool_dim=1)  # average over time, the axis after the batch
fixed.load_state_dict(model.state_dict())
history = torchlog.log_forward_pass(fixed, [seq, feats])
print(f"\nFixed: {history!r}; the output has shape {history[-1].shape}")
assert not history.is_partial and history[-1].shape == (4, 8)
assert torch.equal(history[-1].tensor_contents, fixed(seq, feats))
