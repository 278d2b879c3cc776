"""What capture hands to assembly once the forward pass is over: one frozen CapturedPass."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from torchlog.capture.nodes import RawNode

__all__ = ["CapturedPass", "Failure", "ModuleInfo"]


@dataclass(frozen=True, slots=True)
class Failure:
    """How and where the forward pass raised, for the note on the error and the partial history."""

    error: Exception  # what forward raised; the API re-raises this very object
    func_name: str | None  # the op that raised, or None when Python code raised
    module_path: tuple[tuple[str, int], ...]  # (address, call) stack at the failing op or deepest raise
    parent_nodes: tuple[int, ...]  # nodes the failing op received; () when Python code raised
    site: tuple | None = None  # (CodeInfo, offset) of the user code that called the failing op
    # Its tensor arguments: (slot as ParentEdge.arg, shape or None, dtype, producing node or
    # None, parameter address or None), in argument order.
    args: tuple[tuple, ...] = ()


class ModuleInfo(NamedTuple):
    """One submodule of the logged model, as it was when the pass ended (a named tuple:
    one is made per submodule per call, and they are cheap)."""

    address: str  # e.g. 'features.3'
    type_name: str  # the class name, e.g. 'Conv2d'
    num_params: int  # parameters of the module and all its submodules
    children: tuple[str, ...]  # addresses of its direct submodules (a shared one by its first address)
    aliases: tuple[str, ...] = ()  # its other addresses when registered more than once


@dataclass(frozen=True, slots=True)
class CapturedPass:
    """Everything recorded about one forward pass, as plain data: no model, no live tensors table.

    Assembly turns it into records; storage builds one from a crashed log's node entries.
    """

    nodes: tuple[RawNode, ...]  # in creation order; nodes[i].index == i
    module_calls: Mapping[str, int]  # module address -> how many times it was called
    call_outputs: Mapping[tuple[str, int], tuple[int, ...]]  # (address, call) -> nodes it returned
    modules: tuple[ModuleInfo, ...] = ()  # every submodule in model order, the root excluded
    failure: Failure | None = None  # set when forward raised an Exception
    # Nodes whose saved value is wrong: saved by reference (not copied), then changed by an
    # in-place write no op announced. The API runs the pass again copying them.
    stale_saves: tuple[int, ...] = ()
    # With a plan (capture/plan.py): the actions applied, in order (recorder.FiringRecord),
    # and the node after which `stop_after` ended the pass (None: it ran to the end).
    firings: tuple = ()
    stopped_at: int | None = None
