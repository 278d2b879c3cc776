"""`import torchlog` and `import torchlog.export` load none of the exporters' dependencies."""
from __future__ import annotations

import subprocess
import sys

HEAVY = ("networkx", "tensorboard", "tensorboardX", "onnx", "netron", "google.protobuf")


def test_importing_torchlog_and_its_exporters_loads_no_optional_dependency():
    code = ("import sys, torchlog, torchlog.export; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
