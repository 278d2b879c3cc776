"""Counterfactual replay: a run with interventions recomputed from a history's saved values,
without calling the model (`replay`)."""
from torchlog.replay.counterfactual import replay

__all__ = ["replay"]
