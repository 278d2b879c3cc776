"""Replay: every saved activation checked by re-running the op that made it, and counterfactual
runs recomputed from saved values (`replay`)."""
from torchlog.replay.counterfactual import replay
from torchlog.replay.report import ReplayProblem, ReplayReport
from torchlog.replay.validate import find_replay_problems, validate_saved_activations

__all__ = ["ReplayProblem", "ReplayReport", "find_replay_problems", "replay", "validate_saved_activations"]
