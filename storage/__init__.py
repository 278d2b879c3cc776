"""Writing and reading logs as HDF5 files (installed as torchlog.storage).

`log_forward_pass(..., save_to=path)` streams activations into a log file as they are
produced (and, with save_gradients=True, the gradients of each later backward as they
are computed); `history.save(path)` writes a finished history; `load(path)` opens either as a
ModelHistory whose tensors are read on access; `extract` saves chosen layers over a
dataset into one array per layer (in one process, or sharded under torch.distributed),
and `ActivationDataset` reads them back as a torch Dataset. The file layout is described
in docs/storage.md.
"""
from torchlog.storage.dataset import ActivationDataset
from torchlog.storage.extraction import ActivationFile, extract, open_activations
from torchlog.storage.lazy import StoredTensor, StoredValue
from torchlog.storage.reader import FileHistory, load
from torchlog.storage.values import WriteOptions
from torchlog.storage.writer import LogWriter, save_history

__all__ = ["load", "save_history", "extract", "open_activations", "ActivationFile",
           "ActivationDataset", "LogWriter", "FileHistory", "StoredTensor", "StoredValue",
           "WriteOptions"]
