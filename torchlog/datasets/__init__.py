"""Datasets: run a model over a whole dataset, one call per batch, and send chosen sites' values to sinks.

`run_dataset` is the driver (`driver.py` captures a batch, finding each site's passes as
`site_passes.py` says; `loop.py` runs the batches and the sinks of `sinks.py`);
`statistics` (`stats_sink.py`) accumulates, per site, statistics
over the whole dataset in memory independent of its length (`accumulate.py` per site, with
`moments.py`, `histograms.py`, `covariances.py` and `quantile_sketch.py`), pooling the
dimensions `reduce=` names (`reduce.py`), and returns a `Statistics` (`results.py`) that
hands its means and principal directions to `torchlog.interventions`; histogram bins are
fixed or learned (`learned_histograms.py`). Under torch.distributed each rank runs its block
of batches (`ranks.py`) and the states merge on every rank (`rank_merge.py`); `checkpoint.py`
saves and resumes a `statistics` run. `TensorBoardSink` (`tensorboard_sink.py`) writes each
batch's values to TensorBoard. `torchlog.extract`
runs here too (`extraction.py`, with `batches.py`, on the same driver; `python -m torchlog
extract` in `extract_command.py`) and hands each batch's values to storage's HDF5 sink,
reached lazily.
"""
from torchlog.datasets.accumulate import DEFAULT_STATS
from torchlog.datasets.covariances import covariance
from torchlog.datasets.histograms import histogram
from torchlog.datasets.loop import run_dataset
from torchlog.datasets.quantile_sketch import quantiles
from torchlog.datasets.reduce import keep
from torchlog.datasets.results import SiteStatistics, Statistics
from torchlog.datasets.sinks import CallbackSink, Sink
from torchlog.datasets.stats_sink import StatisticsSink, statistics
from torchlog.datasets.tensorboard_sink import TensorBoardSink

__all__ = ["CallbackSink", "DEFAULT_STATS", "SiteStatistics", "Sink", "Statistics", "StatisticsSink", "TensorBoardSink",
           "covariance", "histogram", "keep", "quantiles", "run_dataset", "statistics"]
