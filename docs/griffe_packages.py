"""Griffe extensions for the API pages: torchlog's installed layout and its `Example:` sections.

setup.cfg installs `vis/` and `storage/` as subpackages of torchlog (package_dir), which
griffe's static finder cannot see: it finds top-level packages only. Loading each folder
with the same loader and setting it as a member of `torchlog` gives its objects their
installed paths, so `from torchlog.vis.options import RenderOptions` inside them resolves.

torchlog's docstrings head their doctests `Example:`, which griffe's Google parser reads as
an admonition (Markdown, where `x['a']['b']` is a reference link) rather than the
`Examples:` section it renders as code; the pages read it as `Examples:`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import re

import griffe

ROOT = Path(__file__).resolve().parent.parent
SUBPACKAGES = ("vis", "storage")  # folder == name under torchlog (setup.cfg's package_dir)
EXAMPLE_HEADING = re.compile(r"^(\s*)Example:$", re.M)


class InstalledSubpackages(griffe.Extension):
    """Set `vis/` and `storage/` as the `vis` and `storage` members of the torchlog package."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.name != "torchlog":
            return
        for name in SUBPACKAGES:
            module = loader.load(ROOT / name)
            loader.modules_collection.del_member(name)  # only reachable as torchlog.<name>
            pkg.set_member(name, module)


class ExampleSections(griffe.Extension):
    """Read a docstring's `Example:` heading as `Examples:`, so its doctest renders as code."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None and "Example:" in obj.docstring.value:
            obj.docstring.value = EXAMPLE_HEADING.sub(r"\1Examples:", obj.docstring.value)
