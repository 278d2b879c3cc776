"""Module outputs logged by torchlog against plain forward hooks, and the model left as it was."""
from __future__ import annotations

import copy
import random

import numpy as np
import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import (
    check_against_plain_run,
    check_history,
    check_module_outputs,
    record_module_outputs,
)
from tests.models import TINY_MODELS, MetadataCalls, ModuleOutputs, MutatedThroughView, StructuredIO


def _structured_args() -> tuple:
    return ({"a": torch.randn(2, 3), "nested": [torch.randn(2, 3)]}, [torch.randn(2, 3), torch.randn(2, 3)])


# name -> (model factory, input factory returning the positional args)
CASES = {name: (cls, lambda make=make: (make(),)) for name, (cls, make) in TINY_MODELS.items()}
CASES["module_outputs"] = (ModuleOutputs, lambda: (torch.randn(2, 3),))
CASES["metadata_calls"] = (MetadataCalls, lambda: (torch.randn(2, 3),))
CASES["structured_io"] = (StructuredIO, _structured_args)
CASES["mutated_through_view"] = (MutatedThroughView, lambda: (torch.randn(2, 3),))


def _build(name: str) -> tuple[nn.Module, tuple]:
    cls, make_args = CASES[name]
    torch.manual_seed(0)
    return cls(), make_args()


def _log_checked(model: nn.Module, args: tuple) -> torchlog.ModelHistory:
    history = torchlog.log_forward_pass(model, list(args), random_seed=0)
    check_history(history)
    return history


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_module_outputs_match_hooks(name: str, training: bool) -> None:
    model, args = _build(name)
    model.train(training)
    history, _, _ = check_against_plain_run(model, args, seed=11)
    assert len(history) > len(args)


def test_module_called_several_times_has_one_output_per_call() -> None:
    model, args = _build("reused")
    history, _, _ = check_against_plain_run(model, args, seed=0)
    assert history.modules["cell"].num_passes == 3
    assert [calls for calls in history.modules["cell"].call_outputs] == \
        [(f"linear_1_1:{k}",) for k in (1, 2, 3)]


def test_hooked_output_mutated_later_is_saved_as_returned() -> None:
    """`lin`'s output is relu'd in place after lin returns; the log keeps the value lin returned."""
    model, (x,) = _build("module_outputs")
    history = _log_checked(model, (x,))
    (label,) = history.modules["lin"].call_outputs[0]
    assert torch.equal(history[label].tensor_contents, model.lin(x).detach())
    assert (history[label].tensor_contents < 0).any(), "the test input must give negative pre-relu values"


def test_parameter_returned_by_a_module_is_not_an_output_pass() -> None:
    model, args = _build("module_outputs")
    history = _log_checked(model, args)
    outputs = history.modules["param"].call_outputs[0]
    assert len(outputs) == 1, f"param returns (x * weight, weight); only x * weight is a pass: {outputs}"
    assert history[outputs[0]].params[0].address == "param.weight"


def test_module_returning_one_tensor_twice_lists_it_twice() -> None:
    model, args = _build("module_outputs")
    history = _log_checked(model, args)
    first, second = history.modules["twice"].call_outputs[0]
    assert first == second and history[first].func_name == "exp"


def test_outputs_follow_the_returned_structure_not_computation_order() -> None:
    """Reversed returns (second, first) with first computed earlier; output #0 is `second`."""
    model, args = _build("module_outputs")
    history = _log_checked(model, args)
    assert [history[label].func_name for label in history.modules["reversed"].call_outputs[0]] == ["mul", "add"]
    assert [history[label].func_name for label in history.modules["as_dict"].call_outputs[0]] == ["sin", "cos"]


@pytest.mark.parametrize("name", ["train_eval", "created_inside", "simple_recurrent"])
def test_logged_output_equals_plain_forward_with_same_seed(name: str) -> None:
    model, args = _build(name)
    model.train()
    for seed in (0, 12345):
        torch.manual_seed(seed)
        expected = copy.deepcopy(model)(*args)
        history = torchlog.log_forward_pass(copy.deepcopy(model), list(args), random_seed=seed)
        (out,) = history.output_layers
        assert torch.equal(history[out].tensor_contents, expected.detach())


def _state(model: nn.Module) -> dict:
    return {
        "tensors": {k: v.clone() for k, v in model.state_dict(keep_vars=True).items()},
        "ids": {k: id(v) for k, v in list(model.named_parameters()) + list(model.named_buffers())},
        "training": {a: m.training for a, m in model.named_modules()},
        "requires_grad": {k: p.requires_grad for k, p in model.named_parameters()},
        "hooks": {a: (len(m._forward_hooks), len(m._forward_pre_hooks)) for a, m in model.named_modules()},
    }


def _rng_state() -> tuple:
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _same_rng(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and a[2][0] == b[2][0] \
        and np.array_equal(a[2][1], b[2][1]) and a[2][2:] == b[2][2:]


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_logging_leaves_model_and_rng_unchanged(name: str, training: bool) -> None:
    model, args = _build(name)
    model.train(training)
    if name == "no_grad_inside":
        model.requires_grad_(False)  # has no parameters, but flags must survive either way
    before, rng_before = _state(model), _rng_state()
    torchlog.log_forward_pass(model, list(args), random_seed=5)
    after, rng_after = _state(model), _rng_state()
    assert _same_rng(rng_before, rng_after), "logging changed the global RNG state"
    for key in ("ids", "training", "requires_grad", "hooks"):
        assert before[key] == after[key], f"logging changed the model's {key}"
    assert before["tensors"].keys() == after["tensors"].keys()
    changed = [k for k, v in before["tensors"].items() if not torch.equal(v, after["tensors"][k])]
    assert not changed, f"logging changed parameters/buffers {changed}"


# ----- the checks themselves must be able to fail --------------------------------------------
def test_oracle_catches_a_wrong_value() -> None:
    model, args = _build("nested")
    plain, logged = copy.deepcopy(model), copy.deepcopy(model)
    seen, _ = record_module_outputs(plain, args, seed=0)
    history = torchlog.log_forward_pass(logged, list(args), random_seed=0)
    seen["block1.inner.lin"][0][0] = seen["block1.inner.lin"][0][0] + 1e-6
    with pytest.raises(AssertionError, match="block1.inner.lin:1"):
        check_module_outputs(history, logged, seen)


def test_oracle_catches_a_missing_call() -> None:
    model, args = _build("reused")
    plain, logged = copy.deepcopy(model), copy.deepcopy(model)
    seen, _ = record_module_outputs(plain, args, seed=0)
    history = torchlog.log_forward_pass(logged, list(args), random_seed=0)
    seen["cell"].pop()
    with pytest.raises(AssertionError, match="'cell'.*3 calls.*2"):
        check_module_outputs(history, logged, seen)


def test_invariant_checker_catches_a_one_sided_edge() -> None:
    model, args = _build("branching")
    history = torchlog.log_forward_pass(model, list(args))
    record = history[1]
    record.children = record.children[:-1]
    with pytest.raises(AssertionError, match="do not list it back"):
        check_history(history)


def test_invariant_checker_catches_wrong_pass_numbers() -> None:
    model, args = _build("simple_recurrent")
    history = torchlog.log_forward_pass(model, list(args))
    history["linear_1_1:2"].pass_num = 3
    with pytest.raises(AssertionError, match="pass_num 3"):
        check_history(history)


def test_invariant_checker_catches_a_module_call_listed_on_one_side() -> None:
    model, args = _build("reused")
    history = torchlog.log_forward_pass(model, list(args))
    history["linear_1_1:1"].output_of_modules += ("act:1",)
    with pytest.raises(AssertionError, match=r"linear_1_1:1.output_of_modules lists 'act:1'"):
        check_history(history)


def test_invariant_checker_catches_a_parent_that_runs_later() -> None:
    model, args = _build("branching")
    history = torchlog.log_forward_pass(model, list(args))
    history[1].op_index, history[2].op_index = history[2].op_index, history[1].op_index
    with pytest.raises(AssertionError, match="execution order"):
        check_history(history)


def test_invariant_checker_catches_saved_value_of_wrong_shape() -> None:
    model, args = _build("nested")
    history = torchlog.log_forward_pass(model, list(args))
    history[2].saved = history[2].saved[:1]
    with pytest.raises(AssertionError, match="saved shape"):
        check_history(history)
