"""torchlog's test suite: `from tests.models import ...` and `from tests.invariants import ...`.

A regular package rather than a namespace folder: a namespace folder loses to any regular
package of its name anywhere on sys.path, and some installed distributions ship a top-level
`tests` package. setup.cfg's `pythonpath = .` puts this checkout first on sys.path, so this one
wins (tests/test_decoy_tests_package.py).
"""
