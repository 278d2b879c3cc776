"""torchlog: record every tensor operation of a PyTorch forward pass."""
from torchlog.api import log_forward_pass
from torchlog.errors import (
    InvalidArgumentTypeError,
    InvalidOptionError,
    LayerNotFoundError,
    LogFileError,
    LogFileExistsError,
    LogFileNotFoundError,
    MissingDependencyError,
    ModelInputError,
    NestedLoggingError,
    NondeterministicModelError,
    TorchlogError,
)
from torchlog.history import ModelHistory
from torchlog.records import LayerRecord, ModuleRecord, ParamInfo, PassRecord, TensorMeta

__version__ = "0.1.0"

__all__ = [
    "log_forward_pass", "ModelHistory", "PassRecord", "LayerRecord", "ModuleRecord", "ParamInfo",
    "TensorMeta", "TorchlogError", "LayerNotFoundError", "InvalidOptionError",
    "InvalidArgumentTypeError", "ModelInputError", "NondeterministicModelError", "NestedLoggingError",
    "LogFileError", "LogFileNotFoundError", "LogFileExistsError", "MissingDependencyError",
]
