"""Where the dataset driver sends the values it captures: one small protocol, and a user's callable as a sink."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from torchlog.errors import InvalidArgumentTypeError

__all__ = ["CallbackSink", "Sink", "as_sinks"]


@runtime_checkable
class Sink(Protocol):
    """Receives, batch after batch, each chosen site's value; `finish` is called once the
    last batch is in and its return value is what the driver returns for this sink.

    `add` gets the site as the user named it, the 0-based batch index and the value: a
    detached copy the sink may keep. A site that names several passes (a layer run in a
    loop, or a module called several times) is added once per pass, in execution order.

    Two methods are optional, called when a sink has them: `end_batch(batch_index)`, once a
    batch's values are all added, and `merge_ranks()`, on every rank before `finish` when
    the batches were shared among the ranks of torch.distributed (each sink then saw its
    rank's batches only).
    """

    def add(self, site: Any, batch_index: int, value: torch.Tensor) -> None:
        """Take one value."""

    def finish(self) -> Any:
        """The result, after the last batch."""


class CallbackSink:
    """A callable `fn(site, batch_index, value)` as a Sink; `finish` returns None.

    Example:
        >>> seen = []
        >>> sink = CallbackSink(lambda site, i, value: seen.append((site, i, tuple(value.shape))))
        >>> sink.add("fc1", 0, torch.zeros(2, 3)); sink.finish(); seen
        [('fc1', 0, (2, 3))]
    """

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any, int, torch.Tensor], Any]) -> None:
        self.fn = fn

    def add(self, site: Any, batch_index: int, value: torch.Tensor) -> None:
        self.fn(site, batch_index, value)

    def finish(self) -> None:
        return None


def as_sinks(sinks: Any) -> list[Sink]:
    """The sinks `sinks` stands for: a Sink, a callable, or a list of them.

    Raises:
        InvalidArgumentTypeError: anything else, or an empty list.
    """
    many = sinks if isinstance(sinks, (list, tuple)) else [sinks]
    found: list[Sink] = []
    for sink in many:
        if isinstance(sink, Sink):
            found.append(sink)
        elif callable(sink):
            found.append(CallbackSink(sink))
        else:
            raise InvalidArgumentTypeError(
                f"sink {sink!r} of type {type(sink).__name__} is not accepted; pass an object with "
                "add(site, batch_index, value) and finish(), a callable fn(site, batch_index, value), "
                "or a list of them")
    if not found:
        raise InvalidArgumentTypeError("sinks=[] sends the values nowhere; pass at least one sink")
    return found
