"""A plan's module-exit fields honoured by forward hooks, for the executors that run without the recorder.

The recorder acts on a module's output when its forward wrapper returns
(`Recorder._act_on_exit`); the lean capture and patched runs have no recorder, so a
pre-hook counts each module's calls and a forward hook, put ahead of the user's own (as
the recorder's wrapper acts before them), applies `OpPlan.at_exits` and `stop_exit` with
the same semantics: the rule's output tensor (`ExitRule.output`) is edited by
`run_action`, put back into the returned structure by `substitute`, and refused when the
structure cannot hold it. What these hooks cannot decide (a rule with an op condition,
which needs the op that made the output) is refused by `exit_refusal` before the pass.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchlog.capture.nesting import find_tensors
from torchlog.capture.plan import (Firing, FiringRecord, OpPlan, StopCapture, inputs_missing, outputs_missing, out_of_order,
                                   run_action, substitute, unreachable)
from torchlog.errors import InterventionError

__all__ = ["ExitActs", "exit_refusal"]


def exit_refusal(plan: OpPlan) -> str | None:
    """Why hooks cannot honour the plan's module-exit fields, or None when they can."""
    for address, rules in plan.at_exits.items():
        for rule in rules:
            if rule.test is not None:
                return (f"at_exits: site {rule.act.site!r} on {address!r} has an op condition, which only the "
                        "full capture can test (it needs the op that made the output); log the pass instead")
    return None


class ExitActs:
    """Hooks on the modules a plan acts or stops at, entered around one pass.

    `firings` receives a FiringRecord per action applied (op_index -1: these executors
    number no passes). `acted` maps id() of each value an op action made (filled by the
    lean capture) to that action's number, so that an exit action listed before it is
    refused as the recorder refuses it.
    """

    def __init__(self, plan: OpPlan, named_modules: dict[str, nn.Module]) -> None:
        self.plan = plan
        wanted = set(plan.at_exits) | set(plan.at_entries)
        if plan.stop_exit is not None:
            wanted.add(plan.stop_exit[0])
        missing = sorted(wanted - set(named_modules))
        if missing:
            raise InterventionError(f"the plan names module {missing[0]!r}, which the model does not have")
        self.modules = {address: named_modules[address] for address in sorted(wanted)}
        self.firings: list[FiringRecord] = []
        self.calls: dict[str, int] = {}
        self.acted: dict[int, tuple[int, Any]] = {}
        self._handles: list = []

    def reset(self) -> None:
        """Start a new pass: no calls counted, no firings (the hooks stay where they are)."""
        self.firings, self.calls, self.acted = [], {}, {}

    def __enter__(self) -> ExitActs:
        self.reset()
        for address, module in self.modules.items():
            # After the user's pre-hooks, as the recorder's forward wrapper sees the inputs.
            self._handles.append(module.register_forward_pre_hook(self._counter(address), with_kwargs=True))
            self._handles.append(module.register_forward_hook(self._actor(address), prepend=True))
        return self

    def __exit__(self, *exc_info: object) -> bool:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        return False

    def _counter(self, address: str) -> Callable:
        def count(module: nn.Module, args: Any, kwargs: Any) -> Any:
            self.calls[address] = self.calls.get(address, 0) + 1
            if address not in self.plan.at_entries:
                return None
            with torch._C.DisableTorchFunction():  # the hook's ops are not the model's
                return self._act_on_inputs((address, self.calls[address]), args, kwargs)
        return count

    def _act_on_inputs(self, call: tuple[str, int], args: tuple, kwargs: dict) -> Any:
        rules = [r for r in self.plan.at_entries[call[0]] if r.call is None or r.call == call[1]]
        if not rules:
            return None
        found = [t for t, _ in find_tensors((args, kwargs)) if not isinstance(t, nn.Parameter)]
        for index in sorted({r.output for r in rules}):
            acts = sorted((r.act for r in rules if r.output == index), key=lambda a: a.number)
            if index >= len(found):
                raise StopCapture(InterventionError(inputs_missing(acts[0].site, call, index, len(found))))
            old = new = found[index]
            for act in acts:
                new, record = run_action(act, new, Firing(act.site, -1, "", call, None, None, (index, len(found))))
                self.firings.append(record)
            args, kwargs = substitute((args, kwargs), old, new)
        return args, kwargs

    def _actor(self, address: str) -> Callable:
        def act(module: nn.Module, args: Any, output: Any) -> Any:
            call = (address, self.calls.get(address, 0))
            with torch._C.DisableTorchFunction():  # the hook's ops are not the model's
                output = self._act(call, output)
            if self.plan.stop_exit == call:
                raise StopCapture()
            return output
        return act

    def _act(self, call: tuple[str, int], output: Any) -> Any:
        rules = [r for r in self.plan.at_exits.get(call[0], ()) if r.call is None or r.call == call[1]]
        if not rules:
            return output
        # Numbered as the recorder numbers a call's outputs: parameters returned as they are left out.
        tensors = [t for t, _ in find_tensors(output) if not isinstance(t, nn.Parameter)]
        for output_index in sorted({r.output for r in rules}):
            acts = sorted((r.act for r in rules if r.output == output_index), key=lambda a: a.number)
            if output_index >= len(tensors):
                raise StopCapture(InterventionError(outputs_missing(acts[0].site, call, output_index,
                                                                    len(tensors), output)))
            old = new = tensors[output_index]
            earlier = self.acted.get(id(old))
            if earlier is not None and earlier[0] > acts[0].number:
                raise StopCapture(InterventionError(out_of_order(acts[0].site, earlier[1], -1, "", call)))
            for act in acts:
                firing = Firing(act.site, -1, "", call, None, (output_index, len(tensors)))
                new, record = run_action(act, new, firing)
                self.firings.append(record)
            replaced = substitute(output, old, new)
            if new is not old and not any(t is new for t, _ in find_tensors(replaced)):
                raise StopCapture(InterventionError(unreachable(acts[0].site, call, output_index, len(tensors),
                                                                type(output).__name__)))
            output = replaced
        return output

