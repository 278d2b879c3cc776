"""Writing and reading logs as HDF5 files (installed as torchlog.storage).

`log_forward_pass(..., save_to=path)` streams activations into a log file as they are
produced (and, with save_gradients=True, the gradients of each later backward as they
are computed); `history.save(path)` writes a finished history; `load(path)` opens either as a
ModelHistory whose tensors are read on access; `ExtractSink` writes the arrays of
`torchlog.extract` (one per layer, one shard per rank under torch.distributed, joined),
which runs the model in torchlog.datasets, and `open_activations` and `ActivationDataset`
read them back. The file layout is described
in docs/storage.md.
"""
from torchlog.storage.dataset import ActivationDataset
from torchlog.storage.arrays import ActivationFile
from torchlog.storage.extraction import ExtractSink, open_activations
from torchlog.storage.lazy import StoredTensor, StoredValue
from torchlog.storage.reader import FileHistory, load
from torchlog.storage.values import WriteOptions
from torchlog.storage.writer import LogWriter, save_history

__all__ = ["load", "save_history", "ExtractSink", "open_activations", "ActivationFile",
           "ActivationDataset", "LogWriter", "FileHistory", "StoredTensor", "StoredValue",
           "WriteOptions"]
