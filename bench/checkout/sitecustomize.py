"""Make `import torchlog` load the checkout at $TORCHLOG_CHECKOUT, for 'before' figures from a worktree.

The editable install maps torchlog, torchlog.storage and torchlog.vis to the main checkout
through a meta-path finder, so PYTHONPATH alone swaps torchlog/ but not storage/ or vis/.
Put this folder first on PYTHONPATH and set TORCHLOG_CHECKOUT to the worktree's root:

    TORCHLOG_CHECKOUT=/tmp/before PYTHONPATH=/tmp/before/bench/checkout:/tmp/before \\
        .venv/bin/python /tmp/before/bench/run.py ...

Without TORCHLOG_CHECKOUT it changes nothing; subprocesses inherit both variables.
"""
import os
import sys

_root = os.environ.get("TORCHLOG_CHECKOUT")
if _root:
    for _finder in sys.meta_path:
        _mapping = getattr(sys.modules.get(getattr(_finder, "__module__", ""), None), "MAPPING", None)
        if isinstance(_mapping, dict) and "torchlog" in _mapping:
            _mapping.update({"torchlog": os.path.join(_root, "torchlog"),
                             "torchlog.storage": os.path.join(_root, "storage"),
                             "torchlog.vis": os.path.join(_root, "vis")})
