"""The protocol between capture and a store that takes each activation as it is saved."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from torchlog.capture.nodes import RawNode

__all__ = ["ActivationSink"]


class ActivationSink(Protocol):
    """Receives every saved activation during the pass (torchlog.storage's `LogWriter.sink`).

    Capture calls it right after creating node `index`, in creation order, with the pass's
    node list so far (read it, never change it: later nodes are appended to it). What it
    returns is kept as the node's saved value instead (a lazy stand-in for data on disk).
    A new pass hands a new list. What it raises propagates like an error of the op.
    """

    def __call__(self, nodes: Sequence[RawNode], index: int, value: Any) -> Any:
        """Store `value`, the activation of `nodes[index]`; return what the node keeps."""
        ...
