"""torchlog.lint (torchlog/invariants.py): passes on real histories, lists every broken invariant."""
from __future__ import annotations

import pickle

import pytest
import torch

import torchlog
from tests.models import Nested, SimpleRecurrent
from torchlog.errors import LintError, TorchlogError
from torchlog.history import all_passes


def _recurrent() -> torchlog.ModelHistory:
    torch.manual_seed(0)
    return torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), random_seed=0)


def test_lint_is_public_and_passes_on_logged_histories() -> None:
    assert torchlog.lint is torchlog.invariants.lint and "lint" in torchlog.__all__
    torchlog.lint(_recurrent(), complete=True)
    torchlog.lint(torchlog.log_forward_pass(Nested(), torch.rand(2, 4)))


def test_lint_accepts_pruned_histories_and_checks_their_layer_order_only() -> None:
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), layers_to_save=["mul"])
    assert len(history) < len(history.info.all_passes)
    torchlog.lint(history)
    with pytest.raises(LintError, match="in order of first appearance"):
        torchlog.lint(history, complete=True)


@pytest.mark.no_lint("builds a history whose output_layers names a pass it does not hold, for lint to flag")
def test_a_list_naming_a_pass_the_history_does_not_hold_is_flagged() -> None:
    # output_layers read from every pass of the run named an output a pruned history does
    # not hold, which its lookup then refused.
    class EveryOutput(torchlog.ModelHistory):
        @property
        def output_layers(self) -> list[str]:
            return [p.label for p in all_passes(self) if p.is_output]

    pruned = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), layers_to_save=["mul"])
    torchlog.lint(pruned)
    listing = EveryOutput(pruned.passes, pruned.layers, dict(pruned.modules), pruned.info)
    with pytest.raises(LintError, match=r"history.output_layers is \['output_1_4'\], but its passes with "
                                        r"is_output are \[\]"):
        torchlog.lint(listing)


def test_saved_values_are_checked_unless_a_postfunc_changed_them() -> None:
    history = torchlog.log_forward_pass(Nested(), torch.rand(2, 4), activation_postfunc=lambda t: t[:1])
    with pytest.raises(LintError, match="saved shape"):
        torchlog.lint(history)
    torchlog.lint(history, check_saved=False)


def test_the_error_lists_every_broken_invariant() -> None:
    history = _recurrent()
    history["linear_1_1:2"].pass_num = 3
    history[1].children = ()
    history["linear_1_1:1"].output_of_modules += ("nowhere:1",)
    with pytest.raises(LintError) as caught:
        torchlog.lint(history)
    error = caught.value
    assert isinstance(error, TorchlogError) and isinstance(error, AssertionError)
    text = str(error)
    assert text.startswith(f"the history breaks {len(error.problems)} invariant(s):")
    for expected in ("pass_num 3", "do not list it back", "names module 'nowhere'"):
        assert any(expected in problem for problem in error.problems), expected
        assert expected in text
    assert pickle.loads(pickle.dumps(error)).problems == error.problems


def test_a_long_list_of_problems_is_cut_with_a_count() -> None:
    history = _recurrent()
    for record in history:
        record.op_index = 0
    with pytest.raises(LintError) as caught:
        torchlog.lint(history)
    problems = caught.value.problems
    assert len(problems) > 20
    assert str(caught.value).endswith(f"... and {len(problems) - 20} more")
    assert str(caught.value).count("\n  - ") == 20
