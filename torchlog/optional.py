"""Importing an optional dependency, or saying which package and extra install it."""
from __future__ import annotations

import importlib
from types import ModuleType

from torchlog.errors import MissingDependencyError

__all__ = ["require"]

# Module (or package prefix) -> (what it needs, what pip installs, the torchlog extra).
_EXTRAS = {
    "torchlog.storage": ("h5py and tqdm", "h5py tqdm", "storage"),
    "pandas": ("pandas", "pandas", "pandas"),
    "graphviz": ("the graphviz Python package", "graphviz", "vis"),
    "networkx": ("networkx", "networkx", "networkx"),
    "tensorboard": ("the tensorboard package", "tensorboard", "tensorboard"),
    "torch.utils.tensorboard": ("the tensorboard package", "tensorboard", "tensorboard"),
    "onnx": ("onnx", "onnx", "onnx"),
    "netron": ("the netron package", "netron", "onnx"),
}


def require(module: str, needed_for: str, note: str = "") -> ModuleType:
    """Import `module`, which `needed_for` (a feature, e.g. 'history.save()') cannot do without.

    Raises:
        MissingDependencyError: the import failed; the message names the feature, the
            missing package with the import error, how to install it, then `note`.

    Example:
        >>> require("pandas.definitely_missing", "this example")
        Traceback (most recent call last):
        ...
        torchlog.errors.MissingDependencyError: this example needs pandas (No module named \
'pandas.definitely_missing'); install it with `pip install pandas` or `pip install torchlog[pandas]`
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        needs, pip_names, extra = next(value for key, value in _EXTRAS.items()
                                       if module == key or module.startswith(key + "."))
        tail = f"; {note}" if note else ""
        raise MissingDependencyError(
            f"{needed_for} needs {needs} ({exc}); install it with `pip install {pip_names}` or "
            f"`pip install torchlog[{extra}]`{tail}") from exc
