"""`torchlog.run`: a model's output under interventions, at the cost of a hooked forward, with no log."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from torch import nn

from torchlog.api import probe_for
from torchlog.arguments import Request, positional_args, prepare
from torchlog.capture import FiringRecord, HookedSpan, hooks_only, run_lean
from torchlog.errors import InterventionError, InvalidOptionError
from torchlog.interventions.records import InterventionRecord, part_of
from torchlog.model_state import eager_submodules, has_compiled, model_kept
from torchlog.options import LogOptions
from torchlog.seeding import new_seed, seeded

__all__ = ["RunResult", "Runner", "run"]


@dataclass(frozen=True, slots=True)
class RunResult:
    """What `torchlog.run` returns: the model's output and every action applied."""

    output: Any  # what forward returned; None when stop_after ended the pass
    interventions: tuple[InterventionRecord, ...]  # one per action applied, in order
    stopped: bool = False  # the pass ended at stop_after


def run(model: nn.Module, input_args: Any, input_kwargs: dict[str, Any] | None = None, *,
        intervene: Any = None, stop_after: Any = None, random_seed: int | None = None) -> RunResult:
    """Run `model` on the inputs with `intervene` applied, and return only its output and
    the firings: the inner loop of an experiment, at about the cost of a forward with one
    plain hook.

    Sites and actions are those of `log_forward_pass(intervene=...)`, honoured by the same
    plan (torchlog/sites): module addresses and selectors on function and module are
    decided as the pass runs, with module hooks alone where nothing else is needed and the
    lean capture (a TorchFunctionMode that counts calls, records nothing) otherwise. A site
    that names a pass by label or position is found on a logged pass of the model first,
    kept per model and input signature, so only the first call with a new input shape pays
    for it. A site that acts nowhere is an error, and the model is left as it was.
    A firing's label is the probe's pass label for label sites, and the module call
    ('transformer.h.1:1') for module sites (no pass labels exist without a log).

    Args:
        model: the module to run; it is left as it was.
        input_args: a tensor, or a list/tuple of positional arguments, as for `log_forward_pass`.
        input_kwargs: keyword arguments for forward.
        intervene: {site: action} or a list of (site, action) pairs.
        stop_after: a site after which the pass ends (`output` is then None).
        random_seed: seed the RNGs for the pass (and put them back after it).

    Returns:
        A RunResult.

    Raises:
        InterventionError: a site matched nothing, an action failed, or the pass ran other
            ops than the probe its label sites were found in.
        InvalidOptionError: neither intervene nor stop_after (use the model itself).
        Exception: whatever the model raises, unchanged.

    Example:
        >>> import torch, torchlog
        >>> from torchlog.interventions import zero_ablate
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
        >>> result = torchlog.run(net, torch.ones(2, 3), intervene={'1': zero_ablate()})
        >>> torch.equal(result.output, net[2].bias.expand(2, 1)), result.interventions[0].label
        (True, '1:1')
    """
    return Runner(model, intervene=intervene, stop_after=stop_after, random_seed=random_seed)(input_args, input_kwargs)


class Runner:
    """`torchlog.run` prepared once for a model and its sites, to run on many inputs (the
    steps of a decode loop, the batches of a dataset): the model's modules are walked, the
    sites checked and the plan's rules built on the first call only; each call then costs
    what `torchlog.run` costs minus that preparation. Probes for label sites are kept per
    input signature, as for `torchlog.run`.

    Raises:
        InvalidOptionError: neither intervene nor stop_after.

    Example:
        >>> import torch, torchlog
        >>> from torchlog.interventions import scale
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())
        >>> halve = torchlog.intervened.Runner(net, intervene={'1': scale(0.5)})
        >>> [torch.equal(halve(x).output, net(x) * 0.5) for x in (torch.ones(1, 3), torch.rand(4, 3))]
        [True, True]
    """

    def __init__(self, model: nn.Module, *, intervene: Any = None, stop_after: Any = None,
                 random_seed: int | None = None) -> None:
        if intervene is None and stop_after is None:
            raise InvalidOptionError("torchlog.run needs intervene= or stop_after=; without them call the model itself")
        self.model = model
        self.options = LogOptions(layers_to_save=None, intervene=intervene, stop_after=stop_after,
                                  random_seed=random_seed)
        self._first: Request | None = None

    @property
    def runs_once(self) -> bool:
        """Whether a call runs the model exactly once (no probe for label sites); False
        until the first call has prepared the sites."""
        acting = None if self._first is None else self._first.acting
        return acting is not None and not (acting.needs_probe or acting.guesses)

    def __call__(self, input_args: Any, input_kwargs: dict[str, Any] | None = None) -> RunResult:
        """Run the model on these inputs under the prepared sites; see `torchlog.run`."""
        if self._first is None:
            request = self._first = prepare(self.model, input_args, input_kwargs, self.options)
            # Whether a submodule is compiled is read once: the walk costs a step of a decode loop.
            self._eager = has_compiled(request.named_modules)
        else:
            seed = new_seed() if self.options.random_seed is None else self.options.random_seed
            first = self._first  # built field by field: dataclasses.replace costs a step's worth
            request = Request(model=first.model, args=positional_args(self.model, input_args),
                              kwargs={} if input_kwargs is None else input_kwargs, options=first.options,
                              seed=seed, entries=first.entries, capture=first.capture,
                              named_modules=first.named_modules, acting=first.acting)
        return _run_request(request, self._eager)


    def span(self) -> RunnerSpan | None:
        """The Runner with its module hooks kept in place across calls (`with runner.span() as
        run: run(args, kwargs)`), for sites that act by module hooks alone; None before the
        first call, or when a site needs a probe, an op rule or the lean capture's mode, or
        a submodule is compiled. Each call is the Runner's own, less registering the hooks."""
        if not self.runs_once or self._eager:
            return None
        plan = self._first.acting.first_plan()
        return RunnerSpan(self._first, plan) if hooks_only(plan) else None


class RunnerSpan:
    """A Runner whose module hooks stay registered while it is entered (see `Runner.span`)."""

    def __init__(self, request: Request, plan: Any) -> None:
        self.request = request
        self._span = HookedSpan(request.model, plan, request.named_modules)

    def __enter__(self) -> RunnerSpan:
        self._span.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> bool:
        return self._span.__exit__(*exc_info)

    def __call__(self, input_args: Any, input_kwargs: dict[str, Any] | None = None) -> RunResult:
        request = self.request
        options = request.options
        seed = new_seed() if options.random_seed is None else options.random_seed
        with seeded(seed, numpy=options.random_seed is not None), model_kept(request.named_modules):
            seen = self._span.run(positional_args(request.model, input_args),
                                  {} if input_kwargs is None else input_kwargs)
        records = tuple(_record(fired) for fired in seen.firings)
        _check_fired(request.acting.sites, records, seen.stopped)
        return RunResult(None if seen.stopped else seen.output, records, seen.stopped)


def _run_request(request: Request, eager: bool = True) -> RunResult:
    """One run of a prepared request: on a kept or new probe where a site needs one."""
    planner = request.acting
    for attempt in range(2):
        probe = None
        if planner.needs_probe or planner.guesses:
            # A stop at a label's pass stops the probe too, where the label's node says.
            probe, _ = probe_for(request, fresh=attempt > 0, guess_stop=attempt == 0)
        try:
            plan = planner.first_plan() if probe is None else planner.plan(probe)
            seen = _lean(request, plan, eager)
        except InterventionError as error:
            guessed_wrong = probe is not None and probe.stopped_at is not None and not attempt
            if not guessed_wrong and (probe is None or attempt or not getattr(error, "torchlog_ops_changed", False)):
                raise
            continue  # a probe stopped at a wrong guess, or one the model no longer matches: probe again
        records = tuple(_record(fired) for fired in seen.firings)
        _check_fired(planner.sites, records, seen.stopped)
        return RunResult(None if seen.stopped else seen.output, records, seen.stopped)
    raise AssertionError("unreachable")


def _lean(request: Request, plan: Any, eager: bool = True) -> Any:
    """One lean pass of the request's model under `plan`, seeded, with its state kept."""
    with seeded(request.seed, numpy=request.options.random_seed is not None), \
            model_kept(request.named_modules), \
            (eager_submodules(request.named_modules) if eager else contextlib.nullcontext()):
        return run_lean(request.model, request.args, request.kwargs, {}, plan=plan,
                        named_modules=request.named_modules, count=False)


def _record(fired: FiringRecord) -> InterventionRecord:
    firing = fired.firing
    if firing.label is not None:
        where = firing.label
    elif firing.module_call is not None:
        where = f"{firing.module_call[0]}:{firing.module_call[1]}"
    else:  # an op selector in the lean capture: no labels without a log
        where = firing.func_name
    return InterventionRecord(firing.site, where, fired.action, float(fired.max_abs_change),
                              firing.op_index, fired.number, part=part_of(firing))


def _check_fired(sites: tuple, records: tuple[InterventionRecord, ...], stopped: bool) -> None:
    """Refuse a run in which a site never acted: nothing passes silently."""
    fired = {record.number for record in records}
    missing = [site for site in sites if site.number not in fired]
    if missing:
        after = " before the pass was stopped" if stopped else ""
        raise InterventionError(
            f"intervene site {missing[0].given!r} matched no op of this run{after}, so its action "
            f"{missing[0].action!r} was never applied")
