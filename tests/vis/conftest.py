"""Shared setup of the rendering tests: skip `needs_dot` tests where graphviz's `dot` is absent."""
from __future__ import annotations

import shutil

import pytest


@pytest.fixture(autouse=True)
def _skip_without_dot(request: pytest.FixtureRequest) -> None:
    """Skip a test marked `needs_dot` on a machine without the `dot` program (only there)."""
    if request.node.get_closest_marker("needs_dot") and shutil.which("dot") is None:
        pytest.skip("graphviz's `dot` program is not installed (apt-get install graphviz)")
