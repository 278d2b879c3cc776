"""Logging a whole generation: one ModelHistory per forward call, the steps as an axis."""
from torchlog.generation.api import log_generation
from torchlog.generation.history import GenerationHistory, StepIntervention, Steps
from torchlog.generation.saving import load_generation
from torchlog.generation.steered import GenerationRun, run_generation

__all__ = ["log_generation", "load_generation", "GenerationHistory", "StepIntervention", "Steps",
           "run_generation", "GenerationRun"]
