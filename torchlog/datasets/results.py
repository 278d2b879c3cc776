"""What `torchlog.datasets.statistics` returns: per site, its statistics, and the hand-off to interventions."""
from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from torchlog.errors import InvalidOptionError, closest_matches
from torchlog.interventions.actions import Action, project_out, replace_with
from torchlog.optional import require

__all__ = ["SiteStatistics", "Statistics"]

# The statistics with one value per feature: to_pandas's columns.
_PER_FEATURE = ("mean", "var", "std", "min", "max", "abs_mean", "zeros", "nonfinite", "below", "above")


@dataclass(frozen=True, slots=True)
class SiteStatistics:
    """One site's statistics over the whole dataset, in float64 (min and max too).

    Per feature, each of the kept `shape`: `mean`, `var`, `std` (population: divided by
    `count`), `min`, `max`, `abs_mean`, `zeros` and `nonfinite` (fractions of the samples),
    `histogram` (shape + (bins,), int64) with `histogram_edges` ((bins + 1,) for fixed bins,
    shape + (bins + 1,) for learned ones), `below` and `above`. Over
    features: `norm` ([mean, root mean square] of each sample's L2 norm), `covariance`
    (features x features, flattened in order), `components` (top principal directions,
    shaped (num, *shape)) and `explained_variance`. Read them as attributes or with
    `names`; only those asked for exist.
    """

    site: Any  # the site as the user named it
    count: int  # samples pooled (rows)
    shape: tuple[int, ...]  # the kept dimensions' sizes: one feature per entry
    kept: tuple[int, ...]  # which dimensions of the site's values were kept
    ndim: int  # the number of dimensions of the site's values
    dtype: torch.dtype  # the site's values' dtype (what an intervention there must give back)
    device: torch.device  # and their device
    values: dict[str, torch.Tensor]  # statistic name -> value

    def __getattr__(self, name: str) -> torch.Tensor:
        try:
            return object.__getattribute__(self, "values")[name]
        except KeyError:
            raise AttributeError(
                f"site {self.site!r} has no statistic {name!r}; it has {sorted(self.values)} (ask "
                "for others with statistics(stats=[...]))") from None

    @property
    def names(self) -> list[str]:
        """The statistics this site holds."""
        return sorted(self.values)

    def __repr__(self) -> str:
        return f"SiteStatistics({self.site!r}, count={self.count}, shape={self.shape}, {self.names})"


class Statistics(Mapping):
    """Statistics of several sites over a dataset: a mapping from site (as named) to its
    SiteStatistics, and `cka`, linear CKA by (site, site) pair.

    Example:
        >>> import torch, torchlog
        >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU())
        >>> stats = torchlog.datasets.statistics(net, torch.randn(64, 3), ["0"], batch_size=16, progress=False)
        >>> stats["0"].mean.shape, stats["0"].count
        (torch.Size([4]), 64)
        >>> action = stats.mean_ablate("0")  # replace the output with its dataset mean
        >>> out = torchlog.run(net, torch.randn(2, 3), intervene={"0": action}).output
        >>> torch.allclose(out[0], stats["0"].mean.float().relu())
        True
    """

    def __init__(self, sites: dict[Any, SiteStatistics], cka: dict[tuple[Any, Any], float]) -> None:
        self._sites = sites
        self.cka = cka

    def __getitem__(self, site: Any) -> SiteStatistics:
        try:
            return self._sites[site]
        except KeyError:
            near = closest_matches(str(site), [str(s) for s in self._sites])
            raise KeyError(f"no statistics for site {site!r}; sites: {list(self._sites)}"
                           + (f"; closest: {', '.join(near)}" if near else "")) from None

    def __iter__(self) -> Iterator[Any]:
        return iter(self._sites)

    def __len__(self) -> int:
        return len(self._sites)

    def __repr__(self) -> str:
        return f"Statistics({len(self)} sites: {list(self._sites)!r})"

    def save(self, path: Any, overwrite: bool = False) -> str:
        """Write these statistics to the HDF5 file `path` (read back with `Statistics.load`).

        A site that is a selector is kept as its text, and comes back as that string. The
        file appears whole or not at all.

        Returns:
            The path written, as str.

        Raises:
            MissingDependencyError: h5py is not installed.
            LogFileExistsError: `path` exists and overwrite is False.
            LogFileError: the path cannot be written.

        Example:
            >>> import os, tempfile, torch, torchlog
            >>> net = torch.nn.Sequential(torch.nn.Linear(3, 4))
            >>> stats = torchlog.datasets.statistics(net, torch.randn(8, 3), ["0"], progress=False)
            >>> path = stats.save(os.path.join(tempfile.mkdtemp(), "stats.h5"))
            >>> torch.equal(Statistics.load(path)["0"].var, stats["0"].var)
            True
        """
        store = require("torchlog.storage.statistics_file", "Statistics.save()")  # lazily: h5py
        sites = [{"site": s.site, "count": s.count, "shape": list(s.shape), "kept": list(s.kept),
                  "ndim": s.ndim, "dtype": s.dtype, "device": s.device, "values": s.values}
                 for s in self._sites.values()]
        return store.write_statistics(path, sites, [(a, b, v) for (a, b), v in self.cka.items()], overwrite)

    @classmethod
    def load(cls, path: Any) -> Statistics:
        """The statistics `save` wrote to `path` (tensors on the CPU; each site's `device` as
        it was saved, where `mean_ablate` and `project_out` put their values).

        Raises:
            MissingDependencyError: h5py is not installed.
            LogFileNotFoundError, LogFileError: no such file, or not a statistics file.
        """
        store = require("torchlog.storage.statistics_file", "Statistics.load()")  # lazily: h5py
        sites, cka = store.read_statistics(path)
        found = {s["site"]: SiteStatistics(**s) for s in sites}
        return cls(found, {(a, b): v for a, b, v in cka})

    def tensors(self) -> dict[Any, dict[str, torch.Tensor]]:
        """{site: {statistic: tensor}}, with `count` as a 0-d int64 tensor."""
        return {site: {"count": torch.tensor(s.count), **s.values} for site, s in self._sites.items()}

    def to_numpy(self) -> dict[Any, dict[str, Any]]:
        """{site: {statistic: numpy array}}, with `count` as a 0-d array."""
        return {site: {name: value.numpy() for name, value in found.items()}
                for site, found in self.tensors().items()}

    def to_pandas(self) -> Any:
        """One row per site and feature: `site`, `feature` (its index in the kept shape),
        `count`, and a column per statistic with one value per feature.

        Raises:
            MissingDependencyError: pandas is not installed.
        """
        pandas = require("pandas", "Statistics.to_pandas()")
        rows = []
        for site, found in self._sites.items():
            per_feature = {name: value.reshape(-1).tolist() for name, value in found.values.items()
                           if name in _PER_FEATURE}
            for k, index in enumerate(itertools.product(*(range(n) for n in found.shape))):
                rows.append({"site": str(site), "feature": index, "count": found.count,
                             **{name: values[k] for name, values in per_feature.items()}})
        return pandas.DataFrame(rows)

    def mean_ablate(self, site: Any) -> Action:
        """An action replacing `site`'s value with its dataset mean (`replace_with`, shaped
        to broadcast over the pooled dimensions, in the site's dtype and device): the mean
        ablation that `interventions.mean_ablate(dims)` does with one batch's own mean."""
        found = self[site]
        shape = [1] * found.ndim
        for dim, size in zip(found.kept, found.shape):
            shape[dim] = size
        return replace_with(found.values["mean"].reshape(shape).to(dtype=found.dtype, device=found.device))

    def project_out(self, site: Any, component: int = 0) -> Action:
        """An action removing principal direction `component` (0: the largest variance) of
        `site` from its value (`interventions.project_out` along the kept dimension).

        Raises:
            InvalidOptionError: the site kept other than one dimension, or has no such
                component (ask for covariance(num_components=...)).
        """
        found = self[site]
        if len(found.kept) != 1:
            raise InvalidOptionError(
                f"project_out needs a direction along one dimension, but site {site!r} kept dimensions "
                f"{found.kept}; compute its statistics with reduce='tokens' or keep(dim)")
        components = found.values.get("components")
        if components is None or not -len(components) <= component < len(components):
            have = 0 if components is None else len(components)
            raise InvalidOptionError(
                f"site {site!r} has {have} principal components, so component={component!r} does not "
                "exist; ask for more with stats=[..., torchlog.datasets.covariance(num_components=...)]")
        direction = components[component].to(dtype=found.dtype, device=found.device)
        return project_out(direction, dim=found.kept[0])
