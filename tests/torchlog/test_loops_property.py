"""Loop folding (torchlog/loops.py) on generated programs: labels and pass counts against the
program points each model was built from, determinism, and the linear-time budget."""
from __future__ import annotations

import copy
import time

import torch
from hypothesis import HealthCheck, given, settings
from torch import nn

import torchlog
from tests.invariants import check_history
from tests.loop_programs import Call, Loop, Op, Program, build, expected_labels, ops_run, programs
from tests.torchlog.test_loops_folding import check_shared_parameters_fold
from torchlog.capture import CaptureOptions, run_captured
from torchlog.loops import group_into_layers

# Fixed examples, no example database: the same programs on every machine and every run.
_SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _log(model: nn.Module, seed: int = 0) -> torchlog.ModelHistory:
    return torchlog.log_forward_pass(model, [torch.rand(2, 3)], random_seed=seed)


@_SETTINGS
@given(programs)
def test_generated_programs_fold_one_layer_per_program_point(program: Program) -> None:
    history = _log(build(program))
    check_history(history)
    check_shared_parameters_fold(history)
    expected = expected_labels(program)
    assert history.layer_labels == expected, "\n".join(
        f"{got:>16} {want:>16}{'' if got == want else '  <-'}"
        for got, want in zip(history.layer_labels, expected))


@_SETTINGS
@given(programs)
def test_generated_programs_group_the_same_way_every_time(program: Program) -> None:
    model = build(program)
    first = _log(model, seed=0).layer_labels
    assert _log(model, seed=1).layer_labels == first
    nodes = _capture(model, torch.rand(2, 3))
    assert group_into_layers(nodes) == group_into_layers(nodes)


def test_generated_program_example_by_hand() -> None:
    """The oracle itself on a program small enough to check by eye."""
    program = Program(("linear", "act", "block"),
                      (Op("sin"), Loop(2, (Call(0), Op("half"), Loop(2, (Call(0),)))), Call(1)))
    assert [kind for _, kind in ops_run(program)] == [
        "sin", *["linear", "mul", "linear", "linear"] * 2, "tanh"]
    assert expected_labels(program) == [
        "input_1_0", "sin_1_1", "linear_1_2:1", "mul_1_3:1", "linear_1_2:2", "linear_1_2:3",
        "linear_1_2:4", "mul_1_3:2", "linear_1_2:5", "linear_1_2:6", "tanh_1_4", "output_1_5"]
    assert _log(build(program)).layer_labels == expected_labels(program)


# ----- the linear-time budget ------------------------------------------------------------------
class _Loop(nn.Module):
    """A Linear, parameter-free ops and a nested parameter-free loop, run `steps` times."""

    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            h = torch.tanh(self.fc(x))
            for _ in range(2):
                h = torch.sin(h) * 0.5
            x = x + h
        return x


def _capture(model: nn.Module, x: torch.Tensor) -> list:
    with torch.no_grad():
        options = CaptureOptions(save_all=False, save_indices=frozenset())
        captured = run_captured(model, (x,), {}, options)
    return list(captured.nodes)


def _unrolled(nodes: list, steps: int) -> list:
    """The nodes of `_Loop(steps)`, made from a capture of `_Loop(3)` by repeating its second
    pass: every op of pass k reads what the same op read in pass 2, moved k - 2 passes on."""
    length = (len(nodes) - 2) // 3  # nodes: input, 3 passes, output
    template = nodes[1 + length:1 + 2 * length]
    out = [_moved(node, node.index, 0) for node in nodes[:1 + length]]
    for k in range(2, steps + 1):
        for node in template:
            out.append(_moved(node, len(out), (k - 2) * length))
    out.append(_moved(nodes[-1], len(out), (steps - 3) * length))
    for node in out:
        node.children = []
    for node in out:
        for parent, _ in node.parents:
            if node.index not in out[parent].children:
                out[parent].children.append(node.index)
    return out


def _moved(node, index: int, shift: int):
    moved = copy.copy(node)
    moved.index = index
    moved.parents = [(p + shift if p > 0 else p, slot) for p, slot in node.parents]
    return moved


def _grouping_seconds(nodes: list, repeats: int) -> float:
    """Best of `repeats`: CPU time of this thread grouping `nodes` (others' load does not count)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.thread_time()
        group_into_layers(nodes)
        best = min(best, time.thread_time() - start)
    return best


def test_unrolled_nodes_match_a_real_capture() -> None:
    nodes = _capture(_Loop(3), torch.rand(2, 3))
    real = _capture(_Loop(6), torch.rand(2, 3))
    made = _unrolled(nodes, 6)
    assert [(n.func_name, n.parents, n.children) for n in made] == \
        [(n.func_name, n.parents, n.children) for n in real]
    assert group_into_layers(made) == group_into_layers(real)


def test_100k_ops_are_grouped_in_under_2_s_and_in_linear_time() -> None:
    nodes = _capture(_Loop(3), torch.rand(2, 3))
    small, large = _unrolled(nodes, 1_430), _unrolled(nodes, 14_300)
    assert len(large) >= 100_000
    start = time.thread_time()
    layers = group_into_layers(large)
    large_s = min(time.thread_time() - start, _grouping_seconds(large, repeats=2))
    assert sorted(len(members) for members in layers) == [1, 1, 14_300, 14_300, 14_300,
                                                          28_600, 28_600]
    small_s = _grouping_seconds(small, repeats=3)
    assert large_s < 2.0, f"grouping {len(large):,} ops took {large_s:.2f} s of CPU time"
    # Ten times the ops may cost at most twenty-five times the time: quadratic work would
    # cost a hundred times.
    assert large_s < 25 * small_s, (
        f"{len(small):,} ops: {small_s:.3f} s, {len(large):,} ops: {large_s:.3f} s")
