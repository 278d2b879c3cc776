"""Interventions: change activations while a logged pass runs (ablate, steer, patch, splice).

Pass them as `log_forward_pass(model, x, intervene={site: action})`, or as a list of
(site, action) pairs, applied in that order where two reach the same op. A site is a
layer label ('relu_1_2', 'linear_1_1:2'), a module address ('h.1', 'cell:3': that module
call's output), a position (-5), or a `torchlog.select` selector. An action is a tensor
(the replacement), a callable `fn(value, firing) -> Tensor`, or one of the helpers here.
`history.interventions` lists every firing; nothing that matched nothing passes silently.

Example:
    >>> import torch, torchlog
    >>> from torchlog.interventions import zero_ablate
    >>> net = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU(), torch.nn.Linear(3, 1))
    >>> h = torchlog.log_forward_pass(net, torch.ones(2, 3), intervene={'1': zero_ablate()})
    >>> [(r.site, r.label, r.action) for r in h.interventions]
    [('1', 'relu_1_2', zero_ablate())]
    >>> torch.equal(h[-1].tensor_contents, net[2].bias.expand(2, 1))
    True
"""
from torchlog.capture import Firing
from torchlog.errors import InterventionError
from torchlog.interventions.actions import (Action, add, clamp, mean_ablate, noise, patch_from,
                                            project_out, replace_with, scale, splice, zero_ablate)
from torchlog.interventions.records import InterventionRecord

__all__ = ["Action", "Firing", "InterventionError", "InterventionRecord", "add", "clamp",
           "mean_ablate", "noise", "patch_from", "project_out", "replace_with", "scale", "splice",
           "zero_ablate"]
