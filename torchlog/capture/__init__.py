"""Recording one forward pass op by op and handing it on as a plain CapturedPass."""
from torchlog.capture.captured import CapturedPass, Failure, ModuleInfo
from torchlog.capture.nodes import RawNode
from torchlog.capture.options import CaptureOptions, Plugin
from torchlog.capture.recorder import Recorder
from torchlog.capture.run import module_table, run_captured
from torchlog.capture.sink import ActivationSink

__all__ = ["ActivationSink", "CaptureOptions", "CapturedPass", "Failure", "ModuleInfo", "Plugin",
           "RawNode", "Recorder", "module_table", "run_captured"]
