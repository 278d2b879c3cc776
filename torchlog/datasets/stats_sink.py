"""Statistics of chosen sites over a whole dataset, in one pass and in memory independent of its length."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError
from torchlog.datasets.accumulate import DEFAULT_STATS, SiteAccumulator, Wanted, as_wanted
from torchlog.datasets.covariances import DEFAULT_MAX_BYTES, CrossCovariance, check_size
from torchlog.datasets.data import Data
from torchlog.datasets.driver import check_sites
from torchlog.datasets.checkpoint import CheckpointedSink, checkpoint_path
from torchlog.datasets.loop import run_batches
from torchlog.datasets.ranks import current_ranks
from torchlog.datasets.rank_merge import merge_rank_states
from torchlog.datasets.reduce import Reduce, as_reduce
from torchlog.datasets.results import Statistics

__all__ = ["StatisticsSink", "statistics"]


def statistics(model: nn.Module, data: Any, sites: Any, stats: Any = DEFAULT_STATS, reduce: Any = "batch", *,
               cka: Any = (), batch_size: int | None = None, stop_after: Any = None,
               progress: bool | None = None, checkpoint: Any = None, checkpoint_every: int = 100) -> Statistics:
    """Statistics of each site's values over the whole of `data`, accumulated batch by batch
    (one model call each) without keeping the values.

    Args:
        model: the module to run (left as it was; run under `torch.no_grad()`).
        data: a tensor (split with `batch_size`), a list or iterable of batches, or a
            DataLoader; batches are tensors, tuples of positional arguments or dicts.
        sites: a site or a list: module addresses, layer labels, positions, selectors.
        stats: names among 'mean', 'var', 'std', 'min', 'max', 'abs_mean', 'zeros',
            'nonfinite', 'norm', 'covariance', 'quantiles', and `histogram(low, high,
            num_bins)`, `covariance(num_components)` and `quantiles(levels, k)` objects
            (default: DEFAULT_STATS, the elementwise ones). The count and mean are always kept.
        reduce: the dimensions pooled into samples, for every site or as {site: reduce}
            (missing sites: 'batch'): 'batch', 'tokens' (all but the last), 'all', ints,
            or `keep(dim)` (all but dim, e.g. a CNN's channels).
        cka: (site, site) pairs to compare with linear CKA, samples being the rows each
            site's reduce makes (the two must make as many per batch).
        batch_size: for a tensor, the batch size to split it by.
        stop_after: a site after which each batch's pass ends.
        progress: show a tqdm bar (None: when tqdm is installed).
        checkpoint: an HDF5 file to save the state to every `checkpoint_every` batches (h5py
            needed); a rerun with the same path, arguments and data loads it and skips the
            batches it covers, giving the uninterrupted run's result. Removed at the end.
            Under torch.distributed each rank keeps `<stem>.rank<r><suffix>`.
        checkpoint_every: batches between two saves of the checkpoint.

    Under torch.distributed (e.g. `torchrun`) each rank passes the whole data, runs its
    contiguous block of batches, and the states are merged on every rank (docs/datasets.md).

    Returns:
        A Statistics: per site, a SiteStatistics; `cka` by pair.

    Raises:
        InvalidArgumentTypeError, InvalidOptionError: bad stats, reduce, cka, sites or data
            (before the model runs); a reduce dimension out of range or a site that names
            nothing (after the first batch's probe); a batch whose kept sizes differ from
            the first's; a covariance too large for its max_bytes; ranks whose sites or
            values' kept sizes differ; a checkpoint of another run (naming what differs).
        LogFileError: a checkpoint path holding another kind of file.
        MissingDependencyError: checkpoint= without h5py.
        Exception: whatever the model raises, unchanged.

    Example:
        >>> import torch, torchlog
        >>> conv = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.ReLU())
        >>> found = statistics(conv, torch.randn(20, 1, 8, 8), ["1"], stats=["mean", "zeros"],
        ...                    reduce=torchlog.datasets.keep(1), batch_size=8, progress=False)
        >>> found["1"].zeros.shape, found["1"].count  # per channel, over 20 * 6 * 6 positions
        (torch.Size([3]), 720)
    """
    batches = Data(data, batch_size)  # checked before the sites' and the sink's own checks
    sites = check_sites(sites)
    sink: Any = StatisticsSink(sites, stats, reduce, cka)
    skip = 0
    if checkpoint is not None:
        ranks = current_ranks()
        sink = CheckpointedSink(sink, checkpoint_path(checkpoint, ranks), checkpoint_every, batches, ranks)
        skip = sink.restore()
    return run_batches(model, batches, sites, [sink], stop_after=stop_after, progress=progress, skip=skip)[0]


class StatisticsSink:
    """A Sink that accumulates the statistics of each site; `finish` returns a Statistics.
    Sinks fed different batches of the same sites merge exactly (`merge`), in any order;
    `state` and `load_state` give and take the whole state as named tensors (checkpoints),
    and `merge_ranks` merges every rank's under torch.distributed (rank_merge.py).

    Raises:
        InvalidArgumentTypeError, InvalidOptionError: when made, bad stats, reduce or cka.
    """

    def __init__(self, sites: list[Any], stats: Any = DEFAULT_STATS, reduce: Any = "batch", cka: Any = ()) -> None:
        self.sites = sites
        self._stats, self._reduce, self._cka = stats, reduce, cka  # to make a blank copy
        self.wanted: Wanted = as_wanted(stats)
        reduces = _reduces(reduce, sites)
        self.accumulators = {site: SiteAccumulator(site, reduces[site], self.wanted) for site in sites}
        self.pairs = _pairs(cka, sites)
        self.cross: dict[tuple[Any, Any], CrossCovariance] = {}
        self._batch = -1  # the batch whose rows `_pending` holds for the CKA pairs
        self._pending: dict[Any, list[torch.Tensor]] = {}

    def add(self, site: Any, batch_index: int, value: torch.Tensor) -> None:
        """Fold one value of `site` into its statistics."""
        accumulator = self.accumulators[site]
        rows = accumulator.rows(value, batch_index)
        accumulator.add(rows)
        if self.pairs:
            if batch_index != self._batch:
                self._flush()
                self._batch = batch_index
            if any(site in pair for pair in self.pairs):
                self._pending.setdefault(site, []).append(rows)

    def merge(self, other: StatisticsSink) -> None:
        """Fold `other` (the same sites, statistics, reduce and CKA pairs, fed other batches)
        into this one.

        Raises:
            InvalidOptionError: other sites, statistics or pairs, or values of other kept sizes.
        """
        mine, theirs = self.describe(), other.describe()
        if mine != theirs:
            raise InvalidOptionError(f"cannot merge statistics of {theirs} into statistics of {mine}: they "
                                     "must have the same sites, stats, reduce and cka pairs")
        self._flush()
        other._flush()
        for site, accumulator in self.accumulators.items():
            accumulator.merge(other.accumulators[site])
        for pair, state in other.cross.items():
            if pair not in self.cross:
                self.cross[pair] = CrossCovariance(state.x.mean.numel(), state.y.mean.numel())
            self.cross[pair].merge(state)

    def end_batch(self, batch_index: int) -> None:
        """Every value of batch `batch_index` is in: feed its rows to the CKA pairs."""
        self._flush()

    def merge_ranks(self) -> None:
        """Replace this rank's state with the merge of every rank's, in rank order, so every
        rank holds the same statistics (called by the loop under torch.distributed).

        Raises:
            InvalidOptionError: ranks whose sites, statistics or values' kept sizes differ,
                naming both.
        """
        self._flush()
        merged = merge_rank_states(self.state(), self.blank)
        self.accumulators, self.cross = merged.accumulators, merged.cross

    def blank(self) -> StatisticsSink:
        """A sink of the same sites, statistics, reduce and pairs that has seen nothing."""
        return StatisticsSink(self.sites, self._stats, self._reduce, self._cka)

    def describe(self) -> dict[str, Any]:
        """The sites, statistics, reduce and pairs, as JSON-ready text: two sinks merge only
        when theirs are equal."""
        wanted = self.wanted
        stats = sorted(wanted.names) + [repr(s) for s in (wanted.histogram, wanted.covariance, wanted.quantiles)
                                        if s is not None]
        return {"sites": [repr(site) for site in self.sites], "stats": stats,
                "reduce": [a.reduce.name for a in self.accumulators.values()],
                "cka": [[repr(a), repr(b)] for a, b in self.pairs]}

    def state(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(description and each site's and pair's metadata, JSON-ready; named tensors):
        the whole state, exact, which `load_state` takes back."""
        self._flush()
        meta: dict[str, Any] = {**self.describe(), "site_meta": [], "cka_widths": {}}
        tensors: dict[str, torch.Tensor] = {}
        for i, accumulator in enumerate(self.accumulators.values()):
            site_meta, site_tensors = accumulator.state()
            meta["site_meta"].append(site_meta)
            tensors.update({f"site{i}.{k}": v for k, v in site_tensors.items()})
        for i, pair in enumerate(self.pairs):
            if pair in self.cross:
                state = self.cross[pair]
                meta["cka_widths"][str(i)] = [state.x.mean.numel(), state.y.mean.numel()]
                tensors.update({f"cka{i}.{k}": v for k, v in state.state().items()})
        return meta, tensors

    def load_state(self, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        """Take the state `state()` gave (of a sink with the same description).

        Raises:
            InvalidOptionError: a state of other sites, statistics, reduce or pairs.
        """
        described = {key: meta[key] for key in self.describe()}
        if described != self.describe():
            raise InvalidOptionError(f"a state of {described} cannot be loaded into statistics of "
                                     f"{self.describe()}: they must match")
        for i, accumulator in enumerate(self.accumulators.values()):
            prefix = f"site{i}."
            accumulator.load_state(meta["site_meta"][i], {k[len(prefix):]: v for k, v in tensors.items()
                                                          if k.startswith(prefix)})
        self.cross = {}
        for key, (width_x, width_y) in meta["cka_widths"].items():
            state = self.cross[self.pairs[int(key)]] = CrossCovariance(width_x, width_y)
            prefix = f"cka{key}."
            state.load_state({k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)})

    def finish(self) -> Statistics:
        """The statistics of every value added."""
        self._flush()
        return Statistics({site: a.result() for site, a in self.accumulators.items()},
                          {pair: state.cka() for pair, state in self.cross.items()})

    def nbytes(self) -> int:
        """Bytes held by the accumulated state: what grows with the features, never with the
        number of batches."""
        tensors = [t for a in self.accumulators.values() for t in a.tensors()]
        tensors += [t for state in self.cross.values() for t in state.tensors()]
        return sum(t.element_size() * t.numel() for t in tensors)

    def _flush(self) -> None:
        """Feed the pending batch's rows to the CKA pairs."""
        for first, second in self.pairs:
            if first not in self._pending or second not in self._pending:
                continue
            rows_x, rows_y = torch.cat(self._pending[first]), torch.cat(self._pending[second])
            if rows_x.shape[0] != rows_y.shape[0]:
                raise InvalidOptionError(
                    f"cka pair ({first!r}, {second!r}): batch {self._batch} gives {rows_x.shape[0]} samples at "
                    f"{first!r} and {rows_y.shape[0]} at {second!r}; CKA pairs samples one to one: give both "
                    "sites a reduce that makes as many rows (such as reduce={site: 'batch'} for both)")
            state = self.cross.get((first, second))
            if state is None:
                check_size((rows_x.shape[1], rows_y.shape[1]), DEFAULT_MAX_BYTES, f"cka between {first!r} and {second!r}")
                state = self.cross[(first, second)] = CrossCovariance(rows_x.shape[1], rows_y.shape[1])
            state.add(rows_x, rows_y)
        self._pending = {}


def _reduces(reduce: Any, sites: list[Any]) -> dict[Any, Reduce]:
    """The Reduce of each site.

    Raises:
        InvalidOptionError: a dict naming a site that is not in `sites`.
    """
    if isinstance(reduce, Mapping):
        unknown = [site for site in reduce if site not in sites]
        if unknown:
            raise InvalidOptionError(f"reduce names site {unknown[0]!r}, which is not in sites={sites!r}")
        return {site: as_reduce(reduce.get(site, "batch")) for site in sites}
    one = as_reduce(reduce)
    return {site: one for site in sites}


def _pairs(cka: Any, sites: list[Any]) -> list[tuple[Any, Any]]:
    """The CKA pairs, checked.

    Raises:
        InvalidArgumentTypeError: not a list of (site, site) pairs.
        InvalidOptionError: a pair naming a site not in `sites`.
    """
    if isinstance(cka, tuple) and len(cka) == 2 and not isinstance(cka[0], (tuple, list)):
        cka = [cka]
    if not isinstance(cka, (list, tuple)) or any(not isinstance(p, (list, tuple)) or len(p) != 2 for p in cka):
        raise InvalidArgumentTypeError(f"cka={cka!r} is not accepted; pass a list of (site, site) pairs")
    for pair in cka:
        for site in pair:
            if site not in sites:
                raise InvalidOptionError(f"cka pair {tuple(pair)!r} names {site!r}, which is not in sites={sites!r}")
    return [tuple(pair) for pair in cka]
