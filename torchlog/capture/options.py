"""What capture keeps per op and what it calls out to: the capture options."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from torchlog.capture.nodes import RawNode
from torchlog.capture.plan import OpPlan
from torchlog.capture.sink import ActivationSink

if TYPE_CHECKING:
    from torchlog.capture.recorder import Recorder

__all__ = ["CaptureOptions", "Plugin"]

# Entered around the forward pass with the recorder: an op source beyond torch functions.
Plugin = Callable[["Recorder"], AbstractContextManager]


@dataclass(slots=True)
class CaptureOptions:
    """What to keep per op, and the extension points; set by the public API after validation."""

    save_all: bool = True
    save_indices: frozenset[int] | None = None  # node indexes to save when not save_all
    # Saved values are the ops' own tensors unless these say to copy: every one, or the
    # nodes a previous run of the same pass found changed by unannounced writes.
    copy_all: bool = False
    copy_indices: frozenset[int] = frozenset()
    detach: bool = False
    output_device: torch.device | None = None
    postfunc: Callable[[torch.Tensor], Any] | None = None
    save_function_args: bool = False
    # Takes each activation as it is saved; the node keeps what it returns instead (a
    # LazyTensor when torchlog.storage streams to disk).
    sink: ActivationSink | None = None
    # For a sink that writes later (a background thread): `sink_settle(index)` returns once
    # the value handed over for node `index` is written or copied, as it is about to be
    # written in place; `sink_settle(None)` once every value is. `sink_stale()` then lists
    # the nodes whose tensors changed between hand-over and write (version counters).
    sink_settle: Callable[[int | None], None] | None = None
    sink_stale: Callable[[], list[int]] | None = None
    # Context-manager factories entered around the forward pass with the recorder, for
    # op sources outside torch functions (Triton kernel launches).
    plugins: tuple[Plugin, ...] = ()
    # Called with (node, tensor) for every new node, e.g. to register gradient hooks.
    on_node: Callable[[RawNode, torch.Tensor], None] | None = None
    # Count each op's bytes saved for backward and CUDA peak (capture/profile.py).
    profile: bool = False
    # Interventions and stops to apply while the pass runs (capture/plan.py), or None.
    plan: OpPlan | None = None
