"""Models that raise: the original exception with a note, and the partial history it carries."""
from __future__ import annotations

import inspect
import traceback

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history
from torch.overrides import TorchFunctionMode

from torchlog.errors import LayerNotFoundError
from torchlog.records import FailedArg


class CatBlock(nn.Module):
    """Concatenates along `dim`: dim=1 fails, since the two tensors differ in rows."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.dim = dim

    def forward(self, x):
        y = self.lin(x)
        extra = torch.ones(3, 4)
        return torch.cat([y, extra], dim=self.dim)


class CatModel(nn.Module):
    """The same ops up to torch.cat whether broken or not; broken, the cat raises."""

    def __init__(self, broken: bool = True) -> None:
        super().__init__()
        self.pre = nn.Linear(4, 4)
        self.block = CatBlock(1 if broken else 0)

    def forward(self, x):
        return self.block(torch.relu(self.pre(x)) * 2).sum(dim=1)


class Checked(nn.Module):
    """User code that raises: an assertion or a missing dict key inside a submodule."""

    class Head(nn.Module):
        def __init__(self, kind: str) -> None:
            super().__init__()
            self.kind = kind

        def forward(self, x):
            x = x.tanh()
            if self.kind == "assert":
                assert x.shape[-1] == 5, f"expected 5 features, got {x.shape[-1]}"
            return {"logits": x}[self.kind]

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.head = Checked.Head(kind)

    def forward(self, x):
        return self.head(self.lin(x))


class LoopFailsLate(nn.Module):
    """A recurrent cell that breaks on its third pass."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)

    def forward(self, x):
        for step in range(4):
            x = torch.relu(self.cell(x))
            if step == 2:
                x = x.view(3, -1)  # 2x4 cannot be viewed as 3 rows
        return x


class Swallows(nn.Module):
    """A submodule raises and forward catches it: a complete pass, not a failure."""

    class Fragile(nn.Module):
        def forward(self, x):
            y = x.exp()
            raise ValueError("fragile")

    def __init__(self) -> None:
        super().__init__()
        self.fragile = Swallows.Fragile()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        try:
            x = self.fragile(x)
        except ValueError:
            x = x.neg()
        return self.lin(x)


def _inputs() -> torch.Tensor:
    return torch.arange(8, dtype=torch.float32).reshape(2, 4) / 8


def _broken_and_working() -> tuple[CatModel, CatModel]:
    torch.manual_seed(0)
    broken = CatModel(broken=True)
    working = CatModel(broken=False)
    working.load_state_dict(broken.state_dict())
    return broken, working


def _log_error(model: nn.Module, x: torch.Tensor, **kwargs) -> BaseException:
    with pytest.raises(BaseException) as info:
        torchlog.log_forward_pass(model, x, **kwargs)
    return info.value


def _forward_frames(exc: BaseException) -> list[tuple[int, str]]:
    """(line, function) of the traceback frames in this file: the model's own code."""
    return [(f.lineno, f.name) for f in traceback.extract_tb(exc.__traceback__) if f.filename == __file__
            and f.name == "forward"]


def test_error_keeps_type_message_and_model_traceback():
    broken, _ = _broken_and_working()
    x = _inputs()
    with pytest.raises(RuntimeError) as plain:
        broken(x)
    err = _log_error(broken, x)
    assert type(err) is RuntimeError
    assert err.args == plain.value.args
    assert _forward_frames(err) == _forward_frames(plain.value)
    assert len(_forward_frames(err)) == 2  # CatModel.forward, then CatBlock.forward


def test_note_names_failing_op_its_module_and_last_op_logged():
    broken, _ = _broken_and_working()
    err = _log_error(broken, _inputs())
    history = err.torchlog_history
    assert len(err.__notes__) == 1
    note = err.__notes__[0]
    assert "'cat'" in note and "module 'block'" in note and "RuntimeError" in note
    assert f"last op logged: {history.layer_labels[-1]}" in note
    assert history.layer_labels[-1].startswith("ones_")
    assert "torchlog_history" in note


def test_partial_history_is_the_prefix_of_the_working_run():
    broken, working = _broken_and_working()
    x = _inputs()
    partial = _log_error(broken, x, random_seed=7).torchlog_history
    full = torchlog.log_forward_pass(working, x, random_seed=7)
    check_history(partial)
    assert partial.is_partial and not full.is_partial
    n = len(partial)
    assert full[n].func_name == "cat"  # the op that raised in the broken model
    assert partial.layer_labels == full.layer_labels[:n]
    for got, want in zip(partial, full):
        assert (got.func_name, got.tensor_meta, got.parents, got.containing_modules) == (
            want.func_name, want.tensor_meta, want.parents, want.containing_modules)
        assert torch.equal(got.tensor_contents, want.tensor_contents), got.label
    assert partial.info.failed_parents == tuple(e.label for e in full[n].parents)


def test_saved_activations_equal_a_plain_run_up_to_the_failure():
    broken, _ = _broken_and_working()
    x = _inputs()
    partial = torchlog.log_forward_pass(broken, x, on_error="return")
    hidden = torch.relu(broken.pre(x))
    assert torch.equal(partial["pre"].tensor_contents, broken.pre(x))
    assert torch.equal(partial["relu_1_2"].tensor_contents, hidden)
    assert torch.equal(partial["block.lin"].tensor_contents, broken.block.lin(hidden * 2))


def test_on_error_return_gives_the_history_the_exception_carries():
    broken, _ = _broken_and_working()
    x = _inputs()
    returned = torchlog.log_forward_pass(broken, x, on_error="return", random_seed=3)
    carried = _log_error(broken, x, random_seed=3).torchlog_history
    assert returned.is_partial
    assert returned.layer_labels == carried.layer_labels
    assert returned.info.failure == carried.info.failure
    assert "'cat'" in returned.info.failure
    for a, b in zip(returned, carried):
        assert torch.equal(a.tensor_contents, b.tensor_contents)


@pytest.mark.parametrize("kind, error", [("assert", AssertionError), ("missing", KeyError)])
def test_errors_raised_by_user_code_name_the_module(kind, error):
    model = Checked(kind)
    x = _inputs()
    with pytest.raises(error) as plain:
        model(x)
    err = _log_error(model, x)
    assert type(err) is error and err.args == plain.value.args
    note = err.__notes__[-1]
    assert f"{error.__name__} raised by Python code in module 'head'" in note
    history = err.torchlog_history
    assert history.layer_labels[-1].startswith("tanh_")
    assert f"last op logged: {history.layer_labels[-1]}" in note
    check_history(history)


def test_partial_history_lookup():
    broken, _ = _broken_and_working()
    history = torchlog.log_forward_pass(broken, _inputs(), on_error="return")
    assert history["block.lin"].func_name == "linear"
    assert history["pre"].module == "pre"
    assert history[-1] is history[history.layer_labels[-1]]
    assert history["ones_1"].is_created
    assert "cat" not in "".join(history.layer_labels)
    with pytest.raises(LayerNotFoundError, match="'cat_1'"):
        history["cat_1"]
    with pytest.raises(LayerNotFoundError):
        history["block"]  # it never returned


def test_partial_history_prints_that_it_is_partial_and_where_it_stopped():
    broken, _ = _broken_and_working()
    history = torchlog.log_forward_pass(broken, _inputs(), on_error="return")
    text = str(history)
    assert "partial" in text.splitlines()[0]
    assert f"Stopped at: {history.info.failure}" in text
    assert "partial" in repr(history)
    for label in history.layer_labels:
        assert f": {label} " in text
    assert str(history["block.lin"]).startswith("Layer linear_2_4")


def test_partial_history_to_pandas():
    broken, _ = _broken_and_working()
    history = torchlog.log_forward_pass(broken, _inputs(), on_error="return")
    frame = history.to_pandas()
    assert list(frame["label"]) == history.layer_labels
    assert frame["has_saved_tensor"].all()


def test_partial_history_to_dot_shows_the_failing_op_and_its_inputs():
    broken, _ = _broken_and_working()
    history = torchlog.log_forward_pass(broken, _inputs(), on_error="return")
    dot = history.to_dot()
    assert dot.count("'cat'") == 1
    for parent in history.info.failed_parents:
        assert f'"{parent}" -> ' in dot


def test_layers_to_save_list_saves_the_selected_ops_that_ran():
    broken, _ = _broken_and_working()
    x = _inputs()
    # 'cat' never finished: it is skipped, not an error hiding the model's own exception.
    err = _log_error(broken, x, layers_to_save=["block.lin", "relu", "cat"])
    history = err.torchlog_history
    assert type(err) is RuntimeError and len(err.__notes__) == 1
    assert set(history.layer_labels) == {"linear_2_4", "relu_1_2"}
    assert torch.equal(history["linear_2_4"].tensor_contents, broken.block.lin(torch.relu(broken.pre(x)) * 2))
    kept = torchlog.log_forward_pass(broken, x, layers_to_save=["relu"], keep_unsaved_layers=True,
                                     on_error="return")
    assert [p.label for p in kept if p.has_saved_tensor] == ["relu_1_2"]
    assert len(kept) == len(history.info.all_passes)


def test_failure_inside_a_loop():
    torch.manual_seed(0)
    model = LoopFailsLate()
    history = torchlog.log_forward_pass(model, torch.rand(2, 4), on_error="return")
    check_history(history)
    assert "'view'" in history.info.failure and "top level" in history.info.failure
    assert history.layer("linear_1_1").num_passes == 3
    assert history["cell:3"].func_name == "linear"
    assert history.info.failed_parents == (history[-1].label,)


def test_an_exception_caught_inside_forward_is_not_a_failure():
    torch.manual_seed(0)
    model = Swallows()
    x = _inputs()
    history = torchlog.log_forward_pass(model, x)
    check_history(history)
    assert not history.is_partial and history.info.failure is None
    neg = history["neg_1_2"]
    assert neg.containing_modules == () and neg.parent_labels == ("input_1_0",)
    assert history["lin"].containing_modules == ("lin:1",)
    assert history["exp_1_1"].containing_modules == ("fragile:1",)
    assert torch.equal(history[-1].tensor_contents, model(x))


@pytest.mark.parametrize("on_error", ["raise", "return"])
def test_keyboard_interrupt_is_never_swallowed_or_annotated(on_error):
    class Interrupted(nn.Module):
        def forward(self, x):
            x = x + 1
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt) as info:
        torchlog.log_forward_pass(Interrupted(), _inputs(), on_error=on_error)
    assert not hasattr(info.value, "__notes__")
    assert vars(info.value) == {}  # no recorder or history keeping tensors alive


def test_model_that_fails_before_any_op():
    class Fails(nn.Module):
        def forward(self, x):
            raise RuntimeError("before anything")

    history = torchlog.log_forward_pass(Fails(), _inputs(), on_error="return")
    assert history.layer_labels == ["input_1_0"]
    assert "last op logged: input_1_0" in history.info.failure
    assert "Stopped at:" in str(history)


# ----- what the history keeps of the call that raised ---------------------------------------------
class JoinsMismatched(nn.Module):
    """torch.cat of a 2-D and a 3-D tensor, inside a submodule; `keyword` passes them by name."""

    class Join(nn.Module):
        def __init__(self, keyword: bool) -> None:
            super().__init__()
            self.keyword = keyword

        def forward(self, y):
            z = torch.relu(y)
            if self.keyword:
                return torch.cat(tensors=[z, y.unsqueeze(0)])
            return torch.cat([z, y.unsqueeze(0)])

    def __init__(self, keyword: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.join = JoinsMismatched.Join(keyword)

    def forward(self, x):
        return self.join(self.fc(x))


class _LastCall(TorchFunctionMode):
    """The oracle: the name and tensor arguments (shape, dtype) of the last torch call begun."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat = [*args, *kwargs.values()]
        flat = [t for v in flat for t in (v if isinstance(v, (list, tuple)) else [v])]
        self.last = (func.__name__, [(tuple(t.shape), t.dtype) for t in flat if isinstance(t, torch.Tensor)])
        return func(*args, **kwargs)


def _source_line(function, needle: str) -> tuple[int, str]:
    """(line number, stripped text) of the line of `function`'s source that contains `needle`."""
    lines, start = inspect.getsourcelines(function)
    found = [(start + i, line.strip()) for i, line in enumerate(lines) if needle in line]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("keyword", [False, True])
def test_the_failed_op_keeps_its_call_site_source_line_and_argument_shapes(keyword):
    torch.manual_seed(0)
    model, x = JoinsMismatched(keyword), torch.randn(2, 4)
    oracle = _LastCall()
    with pytest.raises(RuntimeError), oracle:
        model(x)
    name, shapes = oracle.last
    history = _log_error(model, x).torchlog_history
    failed = history.info.failed_op
    assert failed.func_name == name == "cat"
    number, text = _source_line(JoinsMismatched.Join.forward, "tensors=" if keyword else "torch.cat([")
    assert failed.call_site == f"{inspect.getsourcefile(JoinsMismatched)}:{number} in forward"
    assert failed.source_line == text
    assert [(a.shape, a.dtype) for a in failed.args] == shapes == [((2, 4), torch.float32), ((1, 2, 4), torch.float32)]
    assert [a.arg for a in failed.args] == ([("tensors", 0), ("tensors", 1)] if keyword else [(0, 0), (0, 1)])
    assert tuple(a.source for a in failed.args) == history.info.failed_parents
    assert [history[a.source].func_name for a in failed.args] == ["relu", "unsqueeze"]
    returned = torchlog.log_forward_pass(model, x, on_error="return")
    assert returned.info.failed_op == failed


def test_a_failed_op_names_the_parameter_it_received():
    class WrongWeight(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.randn(3, 5))

        def forward(self, x):
            return nn.functional.linear(x.tanh(), self.weight)

    history = torchlog.log_forward_pass(WrongWeight(), torch.randn(2, 4), on_error="return")
    failed = history.info.failed_op
    assert failed.func_name == "linear"
    assert failed.args == (FailedArg(0, (2, 4), torch.float32, history["tanh_1_1"].label),
                           FailedArg(1, (3, 5), torch.float32, "weight"))
    assert failed.source_line == _source_line(WrongWeight.forward, "linear(")[1]


def test_python_code_that_raises_has_no_failed_op():
    history = torchlog.log_forward_pass(Checked("assert"), _inputs(), on_error="return")
    assert history.is_partial and history.info.failed_op is None
    complete = torchlog.log_forward_pass(CatModel(broken=False), _inputs())
    assert complete.info.failed_op is None
