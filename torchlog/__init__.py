"""torchlog: record every tensor operation of a PyTorch forward pass."""
import sys as _sys
from typing import Any

from torchlog.api import log_forward_pass
from torchlog.errors import (
    InvalidArgumentTypeError,
    InvalidOptionError,
    LayerNotFoundError,
    LintError,
    LogFileError,
    LogFileExistsError,
    LogFileNotFoundError,
    MissingDependencyError,
    ModelInputError,
    NestedLoggingError,
    NondeterministicModelError,
    TorchlogError,
    TorchlogWarning,
    CompiledModelWarning,
    IncompleteLogWarning,
    LogFilePermissionError,
    OpSequenceChangedWarning,
    DistributedExtractError,
    ComparisonError,
    GenerationError,
    StepNotFoundError,
)
from torchlog.history import ModelHistory
from torchlog.invariants import lint
from torchlog.optional import require
from torchlog.options import LogOptions
from torchlog.records import LayerRecord, ModuleRecord, NodeKind, ParamInfo, PassRecord, TensorMeta
from torchlog.validation import validate_saved_activations
from torchlog.comparison import Comparison, compare, find_nonfinite
from torchlog.intervened import RunResult, run
from torchlog.generation import GenerationHistory, load_generation, log_generation
from torchlog import datasets, interventions, patching
from torchlog.sites import select
from torchlog.errors import InterventionError

__version__ = "0.1.0"

# `torchlog.select` is the public spelling of the selectors (torchlog/sites/select.py):
# `import torchlog.select` and `from torchlog.select import func` find the same module.
_sys.modules.setdefault("torchlog.select", select)


def load(path: str) -> ModelHistory:
    """Open a log file written with `save_to=` or `history.save()`; see torchlog.storage.load.

    Raises:
        MissingDependencyError: h5py is not installed (`pip install torchlog[storage]`).
        LogFileNotFoundError, LogFileError: see torchlog.storage.load.
    """
    return _storage().load(path)


def extract(model: Any, inputs: Any, layers: list, to: str, batch_size: int | None = None,
            overwrite: bool = False, progress: bool | None = None,
            compression: str | None = None, tensorboard: Any = None,
            chunks: bool | int | None = None, random_seed: int = 0, stop_after: Any = None,
            changed_ops: str = "error") -> Any:
    """Run `layers` over a dataset into one array per layer in the file `to`; see torchlog.datasets.extraction.

    With `stop_after` (a site, as log_forward_pass takes it) each batch ends there: the
    rest of the model does not run. A batch that runs other ops than the first batch
    before a chosen op is refused; `changed_ops='by_place'` saves it from each op's
    first-batch place instead, with an OpSequenceChangedWarning.

    With `tensorboard` (a folder or a SummaryWriter), each batch also gets a histogram and
    mean/std scalars per extracted layer at step = batch index, written from the values
    extracted (torchlog.datasets.TensorBoardSink): nothing more is logged. Under
    torch.distributed (torchrun), each rank writes a shard and rank 0 joins them into `to`.

    Raises:
        MissingDependencyError: h5py or tqdm is not installed (`pip install torchlog[storage]`),
            or tensorboard is asked for and not installed (`pip install torchlog[tensorboard]`).
    """
    from torchlog.export.tensorboard_events import summary_sink  # lazily, like storage

    with summary_sink(tensorboard) as summaries:
        return _extraction().extract(model, inputs, layers, to, batch_size, overwrite=overwrite,
                                     progress=progress, compression=compression, summaries=summaries,
                                     chunks=chunks, random_seed=random_seed, stop_after=stop_after,
                                     changed_ops=changed_ops)


def _extraction() -> Any:
    from torchlog.datasets import extraction  # which reaches storage (h5py) only when it runs

    return extraction


def _storage() -> Any:
    return require("torchlog.storage", "torchlog.storage")  # lazily: h5py is an optional extra

__all__ = [
    "log_forward_pass", "LogOptions", "load", "extract", "validate_saved_activations", "ModelHistory",
    "PassRecord", "LayerRecord", "ModuleRecord", "ParamInfo", "NodeKind",
    "TensorMeta", "TorchlogError", "LayerNotFoundError", "InvalidOptionError",
    "InvalidArgumentTypeError", "ModelInputError", "NondeterministicModelError", "NestedLoggingError",
    "LogFileError", "TorchlogWarning", "CompiledModelWarning", "LogFileNotFoundError", "LogFileExistsError", "MissingDependencyError",
    "LogFilePermissionError", "IncompleteLogWarning", "lint", "LintError",
    "OpSequenceChangedWarning", "DistributedExtractError", "InterventionError", "interventions",
    "patching", "select", "datasets",
    "compare", "Comparison", "ComparisonError", "find_nonfinite", "run", "RunResult",
    "log_generation", "load_generation", "GenerationHistory", "StepNotFoundError", "GenerationError",
]
