"""The package list, found rather than written out: every package under `torchlog/`, and those
under `vis/` and `storage/`, which install inside it as `torchlog.vis` and `torchlog.storage`.

setup.cfg holds everything else. Its `packages = find:` cannot do this: it names a package by
its path from the folder searched, so `vis/viewer` would install as `vis.viewer`.
tests/test_wheel.py builds the wheel and checks that it holds every file of the three folders.
"""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
# Where each installed top-level package lives in the checkout.
PACKAGE_DIR = {"torchlog": "torchlog", "torchlog.vis": "vis", "torchlog.storage": "storage"}

setup(
    package_dir=PACKAGE_DIR,
    packages=[f"{package}.{sub}" if sub else package
              for package, folder in PACKAGE_DIR.items() for sub in ["", *find_packages(HERE / folder)]],
)
