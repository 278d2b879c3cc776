"""Writing and reading logs as HDF5 files (installed as torchlog.storage)."""
