"""Tests of storage/recovery.py: a process killed while streaming leaves a file that opens."""
from __future__ import annotations

import random
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import pytest
import torch

import torchlog
from torchlog.errors import IncompleteLogWarning

ROOT = Path(__file__).resolve().parents[2]

# The models exist in the child (which is killed) and in the test (which recomputes them).
MODELS = textwrap.dedent("""
    import os, signal, sys, torch
    from torch import nn

    class Loop(nn.Module):
        '''A recurrent cell applied `steps` times; killed (or stopped) at step `stop`.'''

        def __init__(self, stop: int, kill: bool) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.cell = nn.Linear(8, 8)
            self.stop, self.kill = stop, kill

        def forward(self, x):
            for step in range(6):
                if step == self.stop:
                    if self.kill:
                        os.kill(os.getpid(), signal.SIGKILL)
                    break
                x = torch.tanh(self.cell(x)) + x
            return x

    class Chain(nn.Module):
        '''Many cheap ops on a 64 KB tensor; says when it reaches step `say_at`.'''

        def __init__(self, say_at: int = -1) -> None:
            super().__init__()
            self.say_at = say_at

        def forward(self, x):
            for step in range(2000):
                x = x * 0.5 + step
                if step == self.say_at:
                    print("streaming", flush=True)
            return x
""")
_CHILD = MODELS + textwrap.dedent("""
    import torchlog
    import torchlog.storage.background
    if sys.argv[4] == "sync":  # every value written before capture goes on
        torchlog.storage.background.DEFAULT_MAX_BYTES = 0
    model = Loop(stop=3, kill=True) if sys.argv[2] == "loop" else Chain(int(sys.argv[3]))
    x = torch.linspace(-1, 1, 8 if sys.argv[2] == "loop" else 1 << 14)
    torchlog.log_forward_pass(model, x, save_to=sys.argv[1], random_seed=0)
    print("finished")
""")
_models: dict = {}
exec(compile(MODELS, "recovery_models", "exec"), _models)  # noqa: S102 - our own source text


def _start(path: Path, which: str, say_at: int = -1, mode: str = "sync") -> subprocess.Popen:
    """`mode` 'sync' writes each value before capture goes on; 'async' from the writer thread."""
    return subprocess.Popen([sys.executable, "-c", _CHILD, str(path), which, str(say_at), mode], cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _recovered(path: Path) -> torchlog.ModelHistory:
    with pytest.warns(IncompleteLogWarning, match="incomplete: .*rebuilt .* ops from the nodes stored with its activations"):
        history = torchlog.load(path)
    torchlog.lint(history)  # a rebuilt history keeps every invariant of a logged one
    assert history.is_partial
    with h5py.File(path, "r") as file:
        assert file.attrs["status"] == "writing"  # never marked complete
    return history


def test_a_process_killed_mid_forward_leaves_every_finished_layer_readable(tmp_path: Path) -> None:
    path = tmp_path / "run.h5"
    child = _start(path, "loop")
    _, err = child.communicate(timeout=300)
    assert child.returncode == -signal.SIGKILL, err[-2000:]
    recovered = _recovered(path)
    # The same ops run to the same point, in memory: labels and values must agree.
    x = torch.linspace(-1, 1, 8)
    expected = torchlog.log_forward_pass(_models["Loop"](stop=3, kill=False), x, random_seed=0)
    assert recovered.layer_labels == expected.layer_labels[:-1]  # all but the output node
    assert recovered.layer_labels[-1] == "add_1_3:3"  # three steps of the loop ran
    for record in recovered:
        assert torch.equal(record.tensor_contents, expected[record.label].tensor_contents), record.label
    assert [(l.label, l.num_passes) for l in recovered.layers] == [
        (l.label, l.num_passes) for l in expected.layers if l.label != "output_1_4"]
    assert recovered["linear_1_1:2"].parent_labels == ("add_1_3:1",)
    # The module table was written when streaming started; the calls come from the nodes.
    cell = recovered.modules["cell"]
    assert (cell.type_name, cell.num_params, cell.num_passes) == ("Linear", 72, 3)
    assert cell.call_layers == expected.modules["cell"].call_layers


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("attempt", range(2))
def test_a_process_killed_at_a_random_moment_leaves_a_file_that_opens(tmp_path: Path, attempt: int,
                                                                     mode: str) -> None:
    """Written from the writer thread, the values still queued are lost, never the file."""
    path = tmp_path / "run.h5"
    say_at = random.Random(attempt).randrange(5, 300)
    child = _start(path, "chain", say_at, mode)
    assert child.stdout.readline().strip() == "streaming", child.stderr.read()[-2000:]
    child.send_signal(signal.SIGKILL)  # the child streams on while the signal travels
    child.communicate(timeout=60)
    if child.returncode != -signal.SIGKILL:
        pytest.fail(f"the child finished before it was killed; make Chain longer ({child.returncode})")
    recovered = _recovered(path)
    if mode == "sync":
        assert len(recovered) >= 2 * say_at  # at least the ops before "streaming"
    x = torch.linspace(-1, 1, 1 << 14)
    expected = [x]  # the value of each op, by op_index: input, then (* 0.5, + step) per step
    for step in range(len(recovered) // 2 + 1):
        expected.append(expected[-1] * 0.5)
        expected.append(expected[-1] + step)
    for record in recovered:
        if record.saved is not None:
            assert torch.equal(record.tensor_contents, expected[record.op_index]), record.label
    assert recovered.num_saved >= len(recovered) - 1  # at most the op being written is missing
    first = ["input_1_0", "mul_1_1:1", "add_1_2:1"]
    assert recovered.layer_labels[:3] == first[:len(recovered)]  # async: maybe fewer than 3 written


class _UnlistableGroup:
    """An HDF5 group whose index a killed writer left damaged: listing it fails (as h5py's
    'Link iteration failed (bad heap free list)'), looking names up still works."""

    def __init__(self, group: h5py.Group) -> None:
        self.group = group

    def __iter__(self):
        raise RuntimeError("Link iteration failed (bad heap free list)")

    def __contains__(self, name: str) -> bool:
        return name in self.group

    def __getitem__(self, name: str):
        return self.group[name]


def test_recovery_finds_activations_by_name_when_their_group_cannot_be_listed(tmp_path: Path) -> None:
    from torchlog.storage import recovery
    from torchlog.storage.format import ACTIVATIONS

    class Chain(torch.nn.Module):
        def forward(self, x):
            for step in range(4):
                x = torch.tanh(x * 0.5 + step)
            return x

    path = tmp_path / "run.h5"
    torchlog.log_forward_pass(Chain(), torch.linspace(-1, 1, 8), save_to=path, random_seed=0)
    with h5py.File(path, "r") as file:
        listed = recovery._stored_nodes(file)

        class Damaged:
            def get(self, name):
                found = file.get(name)
                return _UnlistableGroup(found) if name == ACTIVATIONS else found

        probed = recovery._stored_nodes(Damaged())
    assert len(listed) >= 12 and [e["index"] for e in probed] == [e["index"] for e in listed]
