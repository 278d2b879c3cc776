"""Shared checks on captured histories: the structural invariants (`torchlog.lint`, like fx's
`graph.lint()`), the lint of every history built while a test runs, and the forward-hook
oracle for module outputs."""
from __future__ import annotations

import copy
import functools
from collections.abc import Callable
from time import perf_counter
from typing import Any

import torch

from torchlog import lint
from torchlog.history import ModelHistory


def check_history(history: ModelHistory, postfunc_used: bool = False,
                  complete: bool | None = None) -> None:
    """Check every structural invariant of `history` with `torchlog.lint`.

    Args:
        history: the history to check.
        postfunc_used: the history was logged with an `activation_postfunc`, so saved
            values need not match the op's shape and dtype.
        complete: whether every pass of the forward pass is in the history (so layer
            numbers must have no gaps); None tells from the history itself.

    Raises:
        torchlog.LintError (an AssertionError): the message lists each broken invariant.
    """
    lint(history, complete=complete, check_saved=not postfunc_used)


# ----- every history built while a test, a docstring example or a tutorial runs ---------------------
NOTE = ("(the test suite lints every ModelHistory built while a test, a docstring example or a "
        "tutorial runs, as it is built: torchlog_lint_plugin.py, tests/test_tutorials.py; mark a test "
        "@pytest.mark.no_lint('why') if it must build a broken one)")


class LintTally:
    """What `linting` checked in this process: `histories`, the `seconds` lint took, and the
    `failures` (LintError messages naming their history) of the running test, which
    torchlog_lint_plugin.py empties per test."""

    histories = 0
    seconds = 0.0
    failures: list[str] = []


TALLY = LintTally()


def linting(original_init: Callable[..., None]) -> Callable[..., None]:
    """`ModelHistory.__init__`, followed by `torchlog.lint` of the history just built.

    Checking at construction sees every history the API, the storage reader, replay and
    torchlog's internal passes build, before anyone can change it, and puts no frame between
    the caller and torchlog (warnings' stacklevels and call sites stay the user's). Saved values
    are compared with their metadata unless an `activation_postfunc` made them; lazy values of a
    loaded history stay on disk.

    Raises:
        LintError: the new history breaks an invariant; a note names the history. It is also
            kept in TALLY.failures, so that a test still fails where torchlog catches the error
            on the way out.
    """
    @functools.wraps(original_init)
    def init_and_lint(self: ModelHistory, *args: Any, **kwargs: Any) -> None:
        from torchlog import LintError

        original_init(self, *args, **kwargs)
        started = perf_counter()
        try:
            lint(self, check_saved=self.info.activation_postfunc is None)
        except LintError as exc:
            named = f"{type(self).__name__} of {self.info.model_name}"
            TALLY.failures.append(f"{named}: {exc}")
            exc.add_note(f"raised by torchlog.lint of the {named} just built {NOTE}")
            raise
        finally:
            TALLY.histories += 1
            TALLY.seconds += perf_counter() - started

    init_and_lint.lints = True  # type: ignore[attr-defined]
    return init_and_lint


def lint_from_now_on() -> None:
    """Lint every ModelHistory this process builds from now on, with `linting`: a tutorial's
    process or notebook kernel, which no pytest fixture reaches. Call `lint_summary` at its end."""
    if not getattr(ModelHistory.__init__, "lints", False):
        ModelHistory.__init__ = linting(ModelHistory.__init__)  # type: ignore[method-assign]


def lint_summary() -> str:
    """One line: how many histories `linting` checked in this process and how long it took.

    Raises:
        AssertionError: a LintError was raised since the tally was last emptied and caught on
            its way out (by torchlog or the code that built the history); lists each one.
    """
    if TALLY.failures:
        raise AssertionError("a LintError was caught before it could fail the run:\n"
                             + "\n".join(TALLY.failures))
    return tally_line()


def tally_line() -> str:
    """How many histories `linting` checked in this process, and how long lint took."""
    return f"torchlog.lint checked {TALLY.histories} histories as they were built, in {TALLY.seconds:.1f} s"


def record_module_outputs(model: torch.nn.Module, args: tuple, kwargs: dict | None = None,
                          seed: int = 0) -> tuple[dict[str, list[list[torch.Tensor | str]]], object]:
    """Run `model` plainly under `seed` with a forward hook on every submodule.

    Each hook flattens its module's output with `torchlog.capture.nesting.find_tensors` (the order
    torchlog uses) and clones every tensor at once, so later in-place ops cannot change
    what was seen. A parameter returned as an output is kept as its address (a str), since
    torchlog logs no pass for it.

    Returns:
        (outputs, model output): address -> one list of tensors per call, in call order.
    """
    from torchlog.capture.nesting import find_tensors

    params = {id(p): a for a, p in model.named_parameters()}
    seen: dict[str, list[list[torch.Tensor | str]]] = {}

    def hook_for(address: str):
        def hook(module, inputs, output):
            tensors = [params.get(id(t)) or t.detach().clone() for t, _ in find_tensors(output)]
            seen.setdefault(address, []).append(tensors)
        return hook

    handles = [m.register_forward_hook(hook_for(a)) for a, m in model.named_modules() if a]
    try:
        _seed_everything(seed)
        output = model(*args, **(kwargs or {}))
    finally:
        for handle in handles:
            handle.remove()
    return seen, output


def _seed_everything(seed: int) -> None:
    import random
    import sys

    torch.manual_seed(seed)
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed(seed % 2**32)


def check_module_outputs(history: ModelHistory, model: torch.nn.Module,
                         seen: dict[str, list[list[torch.Tensor | str]]]) -> None:
    """Compare every module call's logged outputs with what forward hooks saw on a plain run.

    `seen` comes from `record_module_outputs` on an identical copy of `model` run with the
    history's seed. Outputs that are parameters of the model are not logged passes (torchlog
    cannot own them), so they are dropped from the hook side, and only them; each must
    still be a parameter the logged model has.

    Raises:
        AssertionError: a module was called a different number of times, returned a
            different number of logged tensors, or a logged value differs (torch.equal).
    """
    params = dict(model.named_parameters())
    for address, module in history.modules.items():
        calls = seen.get(address, [])
        assert module.num_passes == len(calls), (
            f"module {address!r}: torchlog counts {module.num_passes} calls, hooks saw {len(calls)}")
        for k, (labels, tensors) in enumerate(zip(module.call_outputs, calls), start=1):
            expected = [t for t in tensors if not isinstance(t, str)]
            returned = [t for t in tensors if isinstance(t, str)]
            assert all(name in params for name in returned), f"{address}:{k} returned unknown {returned}"
            assert len(labels) == len(expected), (
                f"module call {address}:{k} returned {len(expected)} tensors (hooks), torchlog "
                f"lists {len(labels)} outputs: {labels!r}")
            for position, (label, want) in enumerate(zip(labels, expected)):
                got = history[label].tensor_contents
                assert isinstance(got, torch.Tensor), f"{address}:{k} output {label} was not saved"
                assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want), (
                    f"module call {address}:{k}, output #{position} ({label}): logged "
                    f"{tuple(got.shape)} {got.dtype} differs from the hooked value "
                    f"{tuple(want.shape)} {want.dtype} (max abs diff "
                    f"{_max_diff(got, want)})")


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    if a.shape != b.shape:
        return "n/a, shapes differ"
    return f"{(a.double() - b.double()).abs().max().item():.3g}" if a.numel() else "0"


def check_against_plain_run(model: torch.nn.Module, args: tuple, kwargs: dict | None = None,
                            seed: int = 0) -> tuple[ModelHistory, torch.nn.Module, Any]:
    """Log a copy of `model` and compare it with a plain hooked run of another copy.

    Both copies start identical and run under `seed`. Checks `check_history`, every
    module call's outputs (`check_module_outputs`) and that the model outputs the
    history reports equal the plain run's outputs exactly.

    Returns:
        (history, the logged copy of the model, the plain run's output).

    Raises:
        AssertionError: any of the checks fails.
    """
    import torchlog
    from torchlog.capture.nesting import find_tensors

    plain, logged = copy.deepcopy(model), copy.deepcopy(model)
    seen, output = record_module_outputs(plain, args, kwargs, seed)
    history = torchlog.log_forward_pass(logged, list(args), input_kwargs=kwargs, random_seed=seed)
    check_history(history, complete=True)
    check_module_outputs(history, logged, seen)
    expected = [t for t, _ in find_tensors(output)]
    labels = history.output_layers
    assert len(labels) == len(expected), (
        f"the model returned {len(expected)} tensors, the history has outputs {labels!r}")
    for position, (label, want) in enumerate(zip(labels, expected)):
        got = history[label].tensor_contents
        assert got.shape == want.shape and torch.equal(got, want.detach()), (
            f"model output #{position} ({label}) differs from a plain forward with seed {seed} "
            f"(max abs diff {_max_diff(got, want.detach())})")
    return history, logged, output


def ancestors(history: ModelHistory, labels: list[str]) -> set[str]:
    """`labels` and every pass they depend on, following parent links."""
    seen: set[str] = set()
    stack = list(labels)
    while stack:
        label = stack.pop()
        if label not in seen:
            seen.add(label)
            stack.extend(history[label].parent_labels)
    return seen
