"""One site's running statistics: its values turned into sample rows, fed to each statistic's state."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, closest_matches
from torchlog.datasets.covariances import Covariance, CovarianceState, check_size
from torchlog.datasets.histograms import Histogram, HistogramCounts
from torchlog.datasets.learned_histograms import LearnedHistogramCounts
from torchlog.datasets.moments import ELEMENTWISE, Moments
from torchlog.datasets.quantile_sketch import QuantileSketch, Quantiles, quantiles
from torchlog.datasets.reduce import Reduce, to_rows
from torchlog.datasets.results import SiteStatistics

__all__ = ["DEFAULT_STATS", "SiteAccumulator", "Wanted", "as_wanted"]

DEFAULT_STATS = ("mean", "var", "std", "min", "max", "abs_mean", "zeros", "nonfinite", "norm")
"""The statistics `statistics()` keeps when `stats=` is not given: every elementwise one."""
_NAMES = (*ELEMENTWISE, "covariance", "histogram", "quantiles")
_SPECS = (Histogram, Covariance, Quantiles)


@dataclass(frozen=True, slots=True)
class Wanted:
    """The statistics asked for: elementwise names, and at most one histogram, one
    covariance and one quantiles."""

    names: frozenset[str]
    histogram: Histogram | None
    covariance: Covariance | None
    quantiles: Quantiles | None


def as_wanted(stats: Any) -> Wanted:
    """The statistics `stats` names: a list of names (see DEFAULT_STATS, 'covariance' and
    'quantiles'), `histogram(low, high, num_bins)`, `covariance(num_components)` and
    `quantiles(levels, k)` objects.

    Raises:
        InvalidArgumentTypeError: not a list, or an entry of another type.
        InvalidOptionError: an unknown name (with the closest), 'histogram' without its
            bins, or a statistic given twice.
    """
    entries = [stats] if isinstance(stats, (str, *_SPECS)) else stats
    if not isinstance(entries, (list, tuple)) or not entries:
        raise InvalidArgumentTypeError(
            f"stats={stats!r} is not accepted; pass a non-empty list of {list(_NAMES)} and "
            "histogram(...)/covariance(...) objects")
    names, specs = set(), {}
    for entry in entries:
        if entry == "histogram":
            raise InvalidOptionError("a histogram needs its bins: pass torchlog.datasets.histogram(low, high, "
                                     "num_bins) (fixed bins) or histogram(num_bins=...) (bins learned from the "
                                     "data) in stats= instead of 'histogram'")
        if entry in ("covariance", "quantiles"):
            entry = Covariance() if entry == "covariance" else quantiles()
        if isinstance(entry, _SPECS) and type(entry) not in specs:
            specs[type(entry)] = entry
        elif isinstance(entry, _SPECS):
            raise InvalidOptionError(f"stats= holds two {type(entry).__name__.lower()} statistics; give one")
        elif isinstance(entry, str) and entry in ELEMENTWISE:
            names.add(entry)
        elif isinstance(entry, str):
            near = closest_matches(entry, _NAMES)
            raise InvalidOptionError(f"unknown statistic {entry!r}; known: {list(_NAMES)}"
                                     + (f"; closest: {', '.join(near)}" if near else ""))
        else:
            raise InvalidArgumentTypeError(f"stats entry {entry!r} of type {type(entry).__name__} is not a "
                                           "statistic name or a histogram(...)/covariance(...) object")
    return Wanted(frozenset(names), specs.get(Histogram), specs.get(Covariance), specs.get(Quantiles))


class SiteAccumulator:
    """The running statistics of one site, made on its first value (whose shape fixes the
    features); later values must keep the kept dimensions' sizes."""

    def __init__(self, site: Any, reduce: Reduce, wanted: Wanted) -> None:
        self.site = site
        self.reduce = reduce
        self.wanted = wanted
        self.pooled: tuple[int, ...] = ()
        self.kept: tuple[int, ...] = ()
        self.ndim = -1  # unknown before the first value
        self.shape: tuple[int, ...] = ()
        self.dtype, self.device = torch.float32, torch.device("cpu")
        self.moments: Moments | None = None
        self.histogram: HistogramCounts | LearnedHistogramCounts | None = None
        self.covariance: CovarianceState | None = None
        self.quantiles: QuantileSketch | None = None

    def rows(self, value: torch.Tensor, batch_index: int) -> torch.Tensor:
        """`value` as float64 sample rows, after checking it against the first value.

        Raises:
            InvalidOptionError: another number of dimensions or other kept sizes than the
                first value's, or (first value) a reduce dimension out of range.
            InvalidArgumentTypeError: a value that is not a real-number tensor.
        """
        if value.is_complex():
            raise InvalidArgumentTypeError(f"site {self.site!r} gives {value.dtype} values; statistics take "
                                           "real numbers (integers and booleans are fine); take .real or .abs()")
        if self.ndim < 0:
            self._begin(value)
        shape = tuple(value.shape[d] for d in self.kept) if value.dim() == self.ndim else None
        if shape != self.shape:
            raise InvalidOptionError(
                f"site {self.site!r} gave a value of shape {tuple(value.shape)} in batch {batch_index}, but its "
                f"first value kept dimensions {self.kept} of sizes {self.shape} (reduce={self.reduce.name}); "
                "the kept dimensions must have the same sizes in every batch: pool the ones that vary")
        return to_rows(value.detach().cpu(), self.pooled, self.kept)

    def _begin(self, value: torch.Tensor) -> None:
        self.pooled, self.kept = self.reduce.split(value.dim(), self.site)
        self.ndim, self.dtype, self.device = value.dim(), value.dtype, value.device
        self.shape = tuple(value.shape[d] for d in self.kept)
        width = 1
        for size in self.shape:
            width *= size
        self.moments = Moments(width, self.wanted.names)
        spec = self.wanted.histogram
        if spec is not None:
            self.histogram = (LearnedHistogramCounts(spec.num_bins, width) if spec.is_learned
                              else HistogramCounts(spec, width))
        if self.wanted.covariance is not None:
            check_size((width,), self.wanted.covariance.max_bytes, f"the covariance of site {self.site!r}")
            self.covariance = CovarianceState(width)
        if self.wanted.quantiles is not None:
            self.quantiles = QuantileSketch(width, self.wanted.quantiles.k)

    def add(self, rows: torch.Tensor) -> None:
        """Fold sample rows (from `rows`) into every statistic."""
        self.moments.add(rows)
        if self.histogram is not None:
            self.histogram.add(rows)
        if self.covariance is not None:
            self.covariance.add(rows)
        if self.quantiles is not None:
            self.quantiles.add(rows)

    def merge(self, other: SiteAccumulator) -> None:
        """Fold `other` (the same site, reduce and statistics, fed other batches) into this one.

        Raises:
            InvalidOptionError: the two saw values of other kept sizes or dimensions.
        """
        if other.ndim < 0:
            return
        if self.ndim < 0:
            self._begin(torch.empty(_example_shape(other), dtype=other.dtype))
            self.device = other.device
        if (self.ndim, self.kept, self.shape) != (other.ndim, other.kept, other.shape):
            raise InvalidOptionError(
                f"cannot merge statistics of site {self.site!r}: one kept dimensions {self.kept} of sizes "
                f"{self.shape} in {self.ndim}-d values, the other {other.kept} of sizes {other.shape} in "
                f"{other.ndim}-d values")
        self.moments.merge(other.moments)
        if self.histogram is not None:
            self.histogram.merge(other.histogram)
        if self.covariance is not None:
            self.covariance.merge(other.covariance)
        if self.quantiles is not None:
            self.quantiles.merge(other.quantiles)

    def result(self) -> SiteStatistics:
        """The statistics, each per-feature one shaped like the kept dimensions."""
        found = {name: value if name == "norm" else value.reshape(self.shape)
                 for name, value in self.moments.results().items()}
        if self.histogram is not None:
            found["histogram"] = self.histogram.counts.reshape(*self.shape, -1)
            edges = self.histogram.edges()  # learned bins: edges per feature
            found["histogram_edges"] = edges if edges.dim() == 1 else edges.reshape(*self.shape, -1)
            found["below"] = self.histogram.below.reshape(self.shape)
            found["above"] = self.histogram.above.reshape(self.shape)
        if self.covariance is not None:
            spectra = self.covariance.results(self.wanted.covariance.num_components)
            found["covariance"] = spectra["covariance"]
            if "components" in spectra:
                found["components"] = spectra["components"].reshape(-1, *self.shape)
                found["explained_variance"] = spectra["explained_variance"]
        if self.quantiles is not None:
            levels = self.wanted.quantiles.levels
            found["quantiles"] = self.quantiles.quantiles(levels).reshape(len(levels), *self.shape)
            found["quantile_levels"] = torch.tensor(levels, dtype=torch.float64)
            found["quantile_rank_error"] = torch.tensor(self.quantiles.rank_error / max(self.moments.count, 1))
        return SiteStatistics(self.site, self.moments.count, self.shape, self.kept, self.ndim, self.dtype,
                              self.device, found)

    def state(self) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
        """(what the values looked like, as JSON-ready values; the statistics' state as
        named tensors), exact: `load_state` takes them back. Before any value: ndim -1."""
        meta = {"ndim": self.ndim, "kept": list(self.kept), "shape": list(self.shape),
                "dtype": str(self.dtype).removeprefix("torch."), "device": str(self.device)}
        tensors: dict[str, torch.Tensor] = {}
        for name, part in self._parts().items():
            tensors.update({f"{name}.{key}": value for key, value in part.state().items()})
        return meta, tensors

    def load_state(self, meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        """Take the state `state()` gave, replacing this one's."""
        if meta["ndim"] < 0:
            return
        shape = [1] * meta["ndim"]
        for dim, size in zip(meta["kept"], meta["shape"]):
            shape[dim] = size
        self._begin(torch.empty(shape, dtype=getattr(torch, meta["dtype"])))
        self.device = torch.device(meta["device"])
        for name, part in self._parts().items():
            part.load_state({key[len(name) + 1:]: value for key, value in tensors.items()
                             if key.startswith(f"{name}.")})

    def _parts(self) -> dict[str, Any]:
        found = {"moments": self.moments, "histogram": self.histogram, "covariance": self.covariance,
                 "quantiles": self.quantiles}
        return {name: part for name, part in found.items() if part is not None}

    def tensors(self) -> Sequence[torch.Tensor]:
        """Every tensor the state holds (to measure its memory)."""
        parts = [] if self.moments is None else list(self.moments.tensors())
        for state in (self.histogram, self.covariance, self.quantiles):
            if state is not None:
                parts += state.tensors()
        return parts


def _example_shape(other: SiteAccumulator) -> tuple[int, ...]:
    """A value shape with `other`'s kept sizes (pooled sizes 1), to start an empty accumulator."""
    shape = [1] * other.ndim
    for dim, size in zip(other.kept, other.shape):
        shape[dim] = size
    return tuple(shape)
