"""Recording one forward pass op by op and handing it on as a plain CapturedPass.

This is capture's public face: modules outside `torchlog/capture/` import capture's names
from here, never from its modules (`tests/test_layering.py` checks it).
"""
from typing import Any

from torchlog.capture.call_sites import site_text
from torchlog.capture.captured import CapturedPass, Failure, ModuleInfo
from torchlog.capture.functionals import FUNCTIONAL_KEY
from torchlog.capture.lean import HookedSpan, Place, call_names, hooks_only, run_lean
from torchlog.capture.module_outputs import ModulePass, ModuleWatcher
from torchlog.capture.nesting import find_tensors
from torchlog.capture.nodes import OP_CONTEXT_KEY, RawNode
from torchlog.capture.ops import UNDEFINED_VALUES, describe
from torchlog.capture.options import CaptureOptions, Plugin
from torchlog.capture.plan import (Act, ExitRule, Firing, FiringRecord, OpPlan, OpRule, OpView, StopCapture,
                                   out_of_order, outputs_missing, run_action, substitute)
from torchlog.capture.recorder import Recorder
from torchlog.capture.rng import rng_restored
from torchlog.capture.run import module_table, run_captured
from torchlog.capture.sink import ActivationSink
from torchlog.capture.writes import returns_nothing_but_writes

__all__ = [
    # running a pass and what it hands on
    "run_captured", "CaptureOptions", "Plugin", "ActivationSink", "CapturedPass", "Failure", "ModuleInfo",
    "RawNode", "Recorder", "module_table", "log_triton_launches",
    # the plan an executor honours, and the lean executor
    "OpPlan", "OpRule", "ExitRule", "OpView", "Act", "Firing", "FiringRecord", "StopCapture",
    "run_action", "substitute", "out_of_order", "outputs_missing", "run_lean", "HookedSpan", "hooks_only", "Place", "call_names",
    # module outputs without a logged pass
    "ModuleWatcher", "ModulePass",
    # facts capture records, and helpers for re-running an op as it ran
    "FUNCTIONAL_KEY", "OP_CONTEXT_KEY", "site_text", "find_tensors", "describe", "rng_restored",
    "returns_nothing_but_writes", "UNDEFINED_VALUES",
]


def __getattr__(name: str) -> Any:
    """`log_triton_launches`, loaded on first use: only a process that imported triton needs it."""
    if name == "log_triton_launches":
        from torchlog.capture.triton import log_triton_launches

        return log_triton_launches
    raise AttributeError(f"module 'torchlog.capture' has no attribute {name!r}")
