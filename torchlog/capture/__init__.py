"""Recording one forward pass op by op: the recorder, its raw nodes, and its plugins."""
from torchlog.capture.nodes import CaptureOptions, Failure, RawNode
from torchlog.capture.recorder import Recorder, run_captured

__all__ = ["CaptureOptions", "Failure", "RawNode", "Recorder", "run_captured"]
