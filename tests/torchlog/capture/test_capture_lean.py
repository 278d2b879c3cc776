"""Tests of torchlog/capture/lean.py: the lean pass counts calls as the recorder numbers them."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.models import TINY_MODELS, MetadataCalls, ModuleOutputs, MutatedThroughView, WritesData
from torchlog.capture import CaptureOptions, run_captured
from torchlog.capture.lean import call_names, run_lean
from torchlog.model_state import model_kept

class Functionals(nn.Module):
    """Python functionals: multi-op bodies (normalize, attention), one-op bodies called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(4, 2, batch_first=True)
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        x = F.normalize(x, dim=-1)
        x = F.relu(self.attn(x, x, x)[0]) + F.relu(x)
        return self.norm(F.normalize(x, dim=1))


CASES = {**TINY_MODELS,
         "functionals": (Functionals, lambda: torch.randn(2, 3, 4)),
         "encoder_layer": (lambda: nn.TransformerEncoderLayer(8, 2, 16, batch_first=True).eval(),
                           lambda: torch.randn(2, 3, 8)),
         "module_outputs": (ModuleOutputs, lambda: torch.randn(2, 3)),
         "metadata_calls": (MetadataCalls, lambda: torch.randn(2, 3)),
         "mutated_through_view": (MutatedThroughView, lambda: torch.randn(2, 4)),
         "writes_data": (WritesData, lambda: torch.randn(3, 4))}


def _recorded_calls(nodes) -> list:
    """The recorder's calls in order, as call_names gives them: name, then count if > 1."""
    outputs: dict[int, list] = {}
    for node in nodes:
        if node.kind == "op" and not (node.extra or {}).get("view_written_by"):
            outputs.setdefault(node.call_id, []).append(node)
    names: list = []
    for call_id in sorted(outputs):
        group = outputs[call_id]
        names.append(group[0].func_name)
        if len(group) != 1:
            names.append(len(group))
    assert sorted(outputs) == list(range(1, len(outputs) + 1))
    return names


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_lean_count_and_copies_match_a_full_capture(name: str) -> None:
    make_model, make_input = CASES[name]
    torch.manual_seed(0)
    model, x = make_model(), make_input()
    torch.manual_seed(1)
    with model_kept(list(model.named_modules())):  # both passes start from the same buffers
        full = run_captured(model, (x.clone(),), {}, CaptureOptions())
    ops = [n for n in full.nodes if n.kind == "op" and not (n.extra or {}).get("view_written_by")]
    wanted: dict[int, tuple[int, ...]] = {}
    for node in ops:
        wanted[node.call_id] = wanted.get(node.call_id, ()) + (node.output_index,)
    torch.manual_seed(1)
    with model_kept(list(model.named_modules())):
        lean = run_lean(model, (x.clone(),), {}, wanted)
    assert call_names(lean.calls) == _recorded_calls(full.nodes)
    for node in ops:
        assert torch.equal(lean.saved[(node.call_id, node.output_index)], node.saved), node.func_name


def test_only_the_wanted_outputs_are_copied_and_the_mode_is_removed() -> None:
    net = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    seen = run_lean(net, (torch.ones(4, 2),), {}, {2: (0,)})
    assert list(seen.saved) == [(2, 0)] and seen.output.shape == (4, 1)
    assert torch._C._len_torch_function_stack() == 0


def test_a_failing_forward_raises_its_own_error_and_leaves_no_mode() -> None:
    class Broken(nn.Module):
        def forward(self, x):
            return x @ torch.ones(5, 5)

    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        run_lean(Broken(), (torch.ones(2, 3),), {}, {})
    assert torch._C._len_torch_function_stack() == 0
