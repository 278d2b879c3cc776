"""What each module call cost: its ops' time, output bytes, bytes saved for backward and peak."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchlog.history import ModelHistory

__all__ = ["ModuleCost", "cost_by_module"]


@dataclass(slots=True)
class ModuleCost:
    """The summed cost of the ops inside one module call, nested modules included."""

    call: str  # 'block1:2': the module's address and call number
    num_ops: int  # passes inside the call
    elapsed_s: float  # their time
    output_bytes: int  # bytes of their outputs
    saved_for_backward_bytes: int | None  # what autograd kept for backward; None unless profiled
    peak_bytes: int | None  # the highest CUDA peak of one op inside; None unless profiled on CUDA


def cost_by_module(history: "ModelHistory") -> dict[str, ModuleCost]:
    """Per module call (in order of first op), the ops' summed cost.

    Time and output bytes are always there; bytes saved for backward need a history
    logged with `profile=True`, and the peak also CUDA. Sums cover the passes in the
    history (those `layers_to_save` left out are not).

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
        >>> h = torchlog.log_forward_pass(net, torch.ones(2, 3), profile=True)
        >>> costs = cost_by_module(h)
        >>> list(costs), costs['1:1'].output_bytes, costs['1:1'].saved_for_backward_bytes
        (['0:1', '1:1'], 32, 32)
    """
    costs: dict[str, ModuleCost] = {}
    for record in history:
        for call in reversed(record.containing_modules):  # outermost first: parents listed first
            cost = costs.get(call)
            if cost is None:
                cost = costs[call] = ModuleCost(call, 0, 0.0, 0, None, None)
            cost.num_ops += 1
            cost.elapsed_s += record.elapsed_s
            cost.output_bytes += record.num_bytes
            if record.saved_for_backward_bytes is not None:
                cost.saved_for_backward_bytes = ((cost.saved_for_backward_bytes or 0)
                                                 + record.saved_for_backward_bytes)
            if record.peak_bytes is not None:
                cost.peak_bytes = max(cost.peak_bytes or 0, record.peak_bytes)
    return costs
