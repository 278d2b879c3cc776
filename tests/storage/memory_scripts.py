"""The start of the subprocess scripts that measure a streaming log's peak memory.

`DEEP_MODEL` defines `MB`, a model `Deep` whose 40 ops each save 8 MB (320 MB in all),
`status(key)` (a /proc/self/status figure in bytes), an 8 MB input `x`, warms torchlog and
the model up, and ends with `reset_peak()`: the kernel's peak resident set size (VmHWM)
restarts from the current RSS, which it returns, so the peak read after logging is the
most memory the log ever held at once. Scripts append their own lines to it.
"""
from __future__ import annotations

import textwrap

__all__ = ["DEEP_MODEL"]

DEEP_MODEL = textwrap.dedent("""
    import sys, torch, torchlog, torch.nn as nn
    torch.set_num_threads(1)
    MB = 1 << 20

    class Deep(nn.Module):  # 40 ops, each saving 8 MB: 320 MB saved in all
        def forward(self, x):
            for _ in range(20):
                x = x * 1.0001 + 1
            return x

    def status(key: str) -> int:
        return int(next(l for l in open("/proc/self/status") if l.startswith(key)).split()[1]) * 1024

    def reset_peak() -> int:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        start = status("VmRSS")
        assert status("VmHWM") - start < MB, "the peak resident set size was not reset"
        return start

    x = torch.rand(2 * MB)  # 8 MB
    torchlog.log_forward_pass(nn.ReLU(), torch.ones(3), save_to=sys.argv[1] + ".warm")  # load every library
    Deep()(x)
""")
