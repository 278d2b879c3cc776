"""Call sites: each op names the line of user code that made it, through torch modules and helpers."""
from __future__ import annotations

import inspect

import torch
from torch import nn

import torchlog
from torchlog.capture.call_sites import CodeInfo, call_site


def _line_of(marker: str) -> int:
    """The line of this file that ends with the comment `# <marker>`."""
    lines = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return next(i for i, text in enumerate(lines, start=1) if text.rstrip().endswith(f"# {marker}"))


def _helper(x: torch.Tensor) -> torch.Tensor:
    return x * 3  # helper-line


class _Sites(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x + 1  # add-line
        y = self.lin(y)  # lin-line
        y = self.seq(y)  # seq-line
        y = _helper(y)  # calls-helper
        return y.sum()


def _site_of(history, layer_type: str, index: int = 0) -> str:
    return [p for p in history if p.layer_type == layer_type][index].call_site


def test_each_op_names_the_user_line_that_made_it():
    history = torchlog.log_forward_pass(_Sites(), torch.randn(2, 4))
    here = __file__.removesuffix("c")  # .py, not a cached .pyc
    assert _site_of(history, "add") == f"{here}:{_line_of('add-line')} in forward"
    # Inside torch modules: the line that called the module, through Sequential as well.
    assert _site_of(history, "linear", 0) == f"{here}:{_line_of('lin-line')} in forward"
    assert _site_of(history, "linear", 1) == f"{here}:{_line_of('seq-line')} in forward"
    assert _site_of(history, "relu") == f"{here}:{_line_of('seq-line')} in forward"
    # A plain function of the user's is user code: its own line.
    assert _site_of(history, "mul") == f"{here}:{_line_of('helper-line')} in _helper"


def test_a_module_called_through_call_impl_directly_is_sited_at_its_caller():
    # `module._call_impl(x)` skips `_wrapped_call_impl`: the walk must not skip a user frame.
    class Direct(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.lin._call_impl(x)  # direct-call

    history = torchlog.log_forward_pass(Direct(), torch.randn(2, 4))
    assert _site_of(history, "linear").endswith(f":{_line_of('direct-call')} in forward")
    assert history["lin"].label == history[1].label


def test_a_site_names_one_code_info_per_code_object():
    def where() -> tuple:
        return call_site(start=inspect.currentframe())

    first, second = where(), where()
    assert isinstance(first[0], CodeInfo) and first[0] is second[0]
    assert first[0].code is where.__code__ and first[0].co_name == "where"
    assert type(first[0]).__hash__ is object.__hash__  # identity: no hashing of the code object


def test_the_line_of_a_site_is_the_frames_line_anywhere_in_a_long_function():
    seen: list[tuple] = []

    def probe() -> None:
        frame = inspect.currentframe().f_back
        seen.append((call_site(start=frame), frame.f_lineno))

    body = "".join(f"    x = x + {i}\n    if x % 3 == 0:\n        probe()\n    for k in range(2):\n"
                   f"        probe() if k else probe()\n    try:\n        probe(); 1 / 0\n"
                   f"    except ZeroDivisionError:\n        probe()\n" for i in range(60))
    namespace = {"probe": probe}
    exec(compile(f"def long(x):\n{body}    return [probe() for _ in range(2)]\n", "long.py", "exec"), namespace)
    for start in range(5):
        namespace["long"](start)
    assert len(seen) > 1000
    assert all(site[0].line_at(site[1]) == line for site, line in seen)
