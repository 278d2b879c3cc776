"""Replay validation: every saved activation of a log checked by re-running the op that made it
(`validate_saved_activations`, `find_replay_problems`)."""
from torchlog.validation.report import ReplayProblem, ReplayReport
from torchlog.validation.validate import find_replay_problems, validate_saved_activations

__all__ = ["ReplayProblem", "ReplayReport", "find_replay_problems", "validate_saved_activations"]
