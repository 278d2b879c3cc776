"""Activation patching at scale: sweeps over sites and positions, and attribution patching.

`sweep` patches each site's clean value into the corrupted run, one run per site (and
position), or many runs per batched forward; `attribution` estimates every site's effect
from one corrupted forward and one backward. Both return a PatchResult (`to_pandas`, `top`,
`to_html`). `replay(history, intervene)` recomputes a logged run downstream of its
interventions from saved values, without calling the model (torchlog.replay).
Sites are those `intervene` takes; the model and torch are left as they were.
"""
from torchlog.patching.gradient_estimate import attribution
from torchlog.patching.result import PatchResult, PatchRow
from torchlog.patching.site_sweep import sweep
from torchlog.replay.counterfactual import replay

__all__ = ["PatchResult", "PatchRow", "attribution", "replay", "sweep"]
