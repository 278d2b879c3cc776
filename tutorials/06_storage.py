"""Tutorial 6: activations on disk with torchlog.storage.

Run it with `python tutorials/06_storage.py`; it takes a few seconds on a CPU and writes its
files to a temporary folder, removed at the end. You will:

1. stream every activation of a small CNN into an HDF5 file while it runs;
2. reopen that file in a fresh Python process, where tensors are read only when asked for;
3. run one layer over a whole dataset into one array, resume an interrupted run, and
   analyse the result with plain numpy (and plain h5py).

The test suite runs this file, so every claim below is checked on every commit.
"""
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np
import torch
from torch import nn

import torchlog
from torchlog.storage import open_activations

torch.manual_seed(0)
folder = Path(tempfile.mkdtemp(prefix="torchlog-tutorial-"))


class SmallCNN(nn.Module):
    """Two conv blocks and a linear classifier for 3x32x32 images."""

    def __init__(self) -> None:
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.block2 = nn.Sequential(nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.block1(x))
        return self.head(torch.flatten(x, 1))


model = SmallCNN().eval()
images = torch.rand(4, 3, 32, 32)

# ---------------------------------------------------------------------------------------
# 1. Stream a forward pass to disk
# ---------------------------------------------------------------------------------------
# With `save_to`, each activation is written to the file as soon as the op produced it and
# the in-memory copy is dropped, so memory stays flat however many layers the model has.
# The file is checked before the model runs (a missing folder or an existing file is an
# error unless overwrite=True), and it is marked complete only at the very end.
log_path = folder / "run.h5"
history = torchlog.log_forward_pass(model, images, save_to=log_path, random_seed=0)
print(f"logged {len(history)} layers into {log_path.name} ({log_path.stat().st_size / 1e6:.1f} MB)")

# The returned history works as usual; its tensors are now read back from the file.
conv = history["block1.0"]  # the first conv, found by its module address
print(conv.label, conv.shape, "->", type(conv.saved).__name__)
assert torch.equal(conv.tensor_contents, model.block1[0](images).detach())

# ---------------------------------------------------------------------------------------
# 2. Reopen the log in a fresh process
# ---------------------------------------------------------------------------------------
# torchlog.load reads only the records (labels, graph, modules); opening a 10 GB log is
# as quick as opening this one. A tensor is read when you touch `tensor_contents`.
# We prove it in a new interpreter, as you would on another day or another machine.
reader = f"""
import torchlog
history = torchlog.load({str(log_path)!r})
print(repr(history))
print(history.layer_labels[:4], '...')
relu = history['block2.1']
print(relu.label, tuple(relu.tensor_contents.shape), float(relu.tensor_contents.mean()))
"""
done = subprocess.run([sys.executable, "-c", reader], capture_output=True, text=True, check=True)
print("fresh process says:\n  " + done.stdout.strip().replace("\n", "\n  "))
assert "ModelHistory of SmallCNN" in done.stdout

# The command line shows the same file without writing any Python:
#   python -m torchlog show run.h5      (the printed summary)
#   python -m torchlog layers run.h5    (every layer with shape and dtype)
#   python -m torchlog render run.h5 --rolled -o graph.svg
done = subprocess.run([sys.executable, "-m", "torchlog", "layers", str(log_path)],
                      capture_output=True, text=True, check=True)
print("\n".join(done.stdout.splitlines()[:5]) + "\n  ...")

# ---------------------------------------------------------------------------------------
# 3. One layer over a dataset, into one array
# ---------------------------------------------------------------------------------------
# `extract` runs the chosen layers batch by batch and appends them to one growing dataset
# per layer: the first axis is the sample. Here: the second block's output for 96 images.
dataset = torch.rand(96, 3, 32, 32)
acts_path = folder / "acts.h5"


def interrupted(data: torch.Tensor, batches_before_stop: int):
    """Batches of 16 images, then a Ctrl-C, as if the user stopped a long run."""
    for i, batch in enumerate(data.split(16)):
        if i == batches_before_stop:
            raise KeyboardInterrupt
        yield batch


try:
    torchlog.extract(model, interrupted(dataset, 2), ["block2"], acts_path)
except KeyboardInterrupt:
    print("interrupted after", open_activations(acts_path).num_samples, "samples")

# Rerunning the same call resumes: the batches already written are skipped.
acts = torchlog.extract(model, dataset, ["block2"], acts_path, batch_size=16)
print(repr(acts))
layer = acts.layers[0]
features = acts[layer].reshape(len(dataset), -1)  # a numpy array: (96, 32 * 8 * 8)

# Plain numpy from here on: how many units ever fire, and which images look alike.
active = (features > 0).mean(axis=0)
print(f"{layer}: {features.shape[1]} units, {np.mean(active > 0):.0%} of them fire for some image")
normed = features / np.linalg.norm(features, axis=1, keepdims=True)
similarity = normed @ normed.T
np.fill_diagonal(similarity, -1)
i, j = np.unravel_index(np.argmax(similarity), similarity.shape)
print(f"most similar pair of images: {i} and {j} (cosine {similarity[i, j]:.3f})")

# The file is ordinary HDF5: any tool that reads HDF5 reads it, no torchlog needed.
with h5py.File(acts_path, "r") as file:
    print("plain h5py:", {name: file["layers"][name].shape for name in file["layers"]})
    assert np.array_equal(file["layers"][layer][()].reshape(len(dataset), -1), features)
    with torch.no_grad():
        expected = model.block2(model.block1(dataset)).reshape(len(dataset), -1).numpy()
    assert np.allclose(features, expected, atol=1e-5)
shutil.rmtree(folder)
