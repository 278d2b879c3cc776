"""What capture hands on (torchlog/capture/run.py, captured.py): a frozen CapturedPass, and its extension points."""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Callable

import pytest
import torch
from torch import nn

import torchlog
from tests.models import Nested
from torchlog.assemble import assemble
from torchlog.capture import CapturedPass, CaptureOptions, Recorder, module_table, run_captured


class _Raises(nn.Module):
    def __init__(self, interrupt: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.interrupt = interrupt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.interrupt:
            raise KeyboardInterrupt
        return torch.mm(y, torch.ones(5, 5))  # a RuntimeError from the mm op: shapes differ


def test_a_pass_is_handed_on_as_frozen_plain_data_that_assembly_reads_alone() -> None:
    model = Nested()
    captured = run_captured(model, (torch.rand(2, 4),), {}, CaptureOptions())
    assert isinstance(captured, CapturedPass) and captured.failure is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        captured.nodes = ()
    assert [n.index for n in captured.nodes] == list(range(len(captured.nodes)))
    assert [m.address for m in captured.modules] == [a for a, _ in model.named_modules() if a]
    assert all(captured.module_calls[a] >= 1 for a in captured.module_calls)
    built = assemble(captured)
    assert [p.op_index for p in built.passes] == list(range(len(captured.nodes)))
    assert set(built.modules) == {m.address for m in captured.modules}


def test_a_failed_pass_comes_back_with_the_error_and_nothing_set_on_it() -> None:
    captured = run_captured(_Raises(), (torch.rand(2, 3),), {}, CaptureOptions())
    failure = captured.failure
    assert isinstance(failure.error, RuntimeError) and failure.func_name == "mm"
    assert failure.module_path == ()
    assert [captured.nodes[i].func_name for i in failure.parent_nodes] == ["linear", "ones"]
    assert not [k for k in vars(failure.error) if k.startswith("torchlog")]


def test_the_api_sets_only_the_documented_attribute_on_the_users_exception() -> None:
    with pytest.raises(RuntimeError) as caught:
        torchlog.log_forward_pass(_Raises(), torch.rand(2, 3))
    assert [k for k in vars(caught.value) if k.startswith("torchlog")] == ["torchlog_history"]


def test_keyboard_interrupt_leaves_capture_at_once() -> None:
    with pytest.raises(KeyboardInterrupt):
        run_captured(_Raises(interrupt=True), (torch.rand(2, 3),), {}, CaptureOptions())


def test_the_sink_gets_each_saved_value_with_the_node_list_so_far() -> None:
    seen: list[tuple[int, int, str]] = []

    def sink(nodes, index, value):
        seen.append((index, len(nodes), nodes[index].func_name))
        return ("stored", index)

    captured = run_captured(Nested(), (torch.rand(2, 4),), {}, CaptureOptions(sink=sink))
    assert [i for i, _, _ in seen] == sorted({i for i, _, _ in seen}) == [i for i, _, _ in seen]
    assert all(i < size for i, size, _ in seen)
    assert all(captured.nodes[i].saved == ("stored", i) for i, _, _ in seen)


_launchers: list = []  # the launch function of the plugin entered last


class _Kernel(nn.Module):
    """Calls an op torch does not see, like a Triton launch, which a plugin records."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        return _launchers[-1](x, out)


def _plugin(fail: bool):
    @contextlib.contextmanager
    def plugin(recorder: Recorder):
        def launch(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
            if fail:
                recorder.note_failure("double", [x, out])
                raise RuntimeError("kernel failed")
            with torch._C.DisableTorchFunction():
                out.data.copy_(x * 2)  # like a kernel: no version bump
            recorder.record_external("double", [(x, 0), (out, 1)], [out], inplace=[False])
            return out

        _launchers.append(launch)
        try:
            yield
        finally:
            _launchers.pop()

    return plugin


def test_a_plugin_records_ops_and_failures_through_two_public_methods() -> None:
    x = torch.rand(2, 3)
    captured = run_captured(_Kernel(), (x,), {}, CaptureOptions(plugins=(_plugin(fail=False),)))
    assert [n.func_name for n in captured.nodes] == ["input", "empty_like", "double", "output"]
    assert not captured.nodes[2].is_inplace and captured.nodes[2].parents == [(0, 0), (1, 1)]
    assert torch.equal(captured.nodes[-1].saved, x * 2)
    failed = run_captured(_Kernel(), (x,), {}, CaptureOptions(plugins=(_plugin(fail=True),)))
    assert failed.failure.func_name == "double" and str(failed.failure.error) == "kernel failed"
    assert [failed.nodes[i].kind for i in failed.failure.parent_nodes] == ["input", "op"]
    # Its arguments as received, and the line of the plugin's code that reported the failure.
    assert failed.failure.args == ((0, (2, 3), torch.float32, 0, None), (1, (2, 3), torch.float32, 1, None))
    code, offset = failed.failure.site
    lines, start = inspect.getsourcelines(code.code)
    assert code.co_name == "launch" and 'note_failure("double"' in lines[code.line_at(offset) - start]


class _Shared(nn.Module):
    """A module registered under three addresses, a None slot, a cycle and a lazy layer."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Linear(3, 4)
        self.blocks = nn.ModuleList([nn.Sequential(nn.ReLU(), nn.Linear(4, 4)) for _ in range(2)])
        for block in self.blocks:
            block.add_module("cpe", self.first)
        self.empty = None
        self.register_module("gap", None)
        self.lazy = nn.LazyLinear(2)
        self.blocks[1].add_module("loop", self.blocks)  # a submodule that is its own ancestor


def _module_table_oracle(model: nn.Module) -> list[tuple]:
    """What module_table must say, worked out another way: descendants by address prefix,
    and every registration path found by a walk that stops only at cycles."""
    named = list(model.named_modules())
    first = {id(m): a for a, m in named}

    def own(m: nn.Module) -> int:
        return sum(p.numel() for p in m._parameters.values()
                   if p is not None and not isinstance(p, nn.parameter.UninitializedParameter))

    paths: dict[int, list[str]] = {}

    def walk(address: str, module: nn.Module, ancestors: tuple) -> None:
        paths.setdefault(id(module), []).append(address)
        for name, child in module._modules.items():
            if child is not None and id(child) not in ancestors:
                walk(f"{address}.{name}" if address else name, child, ancestors + (id(child),))

    walk("", model, (id(model),))
    table = []
    for address, module in named[1:]:
        inside = [m for a, m in named if a == address or a.startswith(address + ".")]
        children = []
        for child in module._modules.values():
            a = None if child is None else first[id(child)]
            if a and a != address and not address.startswith(a + ".") and a not in children:
                children.append(a)
        others = tuple(dict.fromkeys(p for p in paths[id(module)] if p != address))
        table.append((address, type(module).__name__, sum(own(m) for m in inside), tuple(children), others))
    return table


@pytest.mark.parametrize("make", [Nested, _Shared, lambda: nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU()))])
def test_the_module_table_matches_an_independent_count(make: Callable[[], nn.Module]) -> None:
    model = make()
    assert [tuple(info) for info in module_table(list(model.named_modules()))] == _module_table_oracle(model)


def test_the_module_table_of_a_real_model_matches_an_independent_count() -> None:
    transformers = pytest.importorskip("transformers")
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50,
                                                                 n_positions=16))  # lm_head shares wte's weight
    assert [tuple(info) for info in module_table(list(model.named_modules()))] == _module_table_oracle(model)
