"""What `pip install "torchlog[vis,storage]"` gives a user (setup.py, setup.cfg, pyproject.toml).

The wheel is built from the checkout's files (`pip wheel`, build isolation as a user's build has
it) and installed, without `-e`, into a fresh venv: torch first, pinned to the suite's own
version, then the wheel with its extras. There, run from a folder outside the checkout so that
nothing of the source tree can be imported, every module of every package imports and the
README's quickstart runs. The wheel must hold every file of `torchlog/`, `vis/` and `storage/`
and nothing else, so a new package or asset cannot be left out of it unseen. The editable
install and setup.cfg's `pythonpath = .` hide all of this from every other test.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

from tests.test_docs_site import EXAMPLE_BLOCK

ROOT = Path(__file__).resolve().parent.parent
# Each folder of the checkout and where it installs (setup.py's PACKAGE_DIR).
INSTALLED_AS = {"torchlog": "torchlog", "vis": "torchlog/vis", "storage": "torchlog/storage"}
BUILD_FILES = ("setup.py", "setup.cfg", "pyproject.toml", "README.md")
EXTRAS = "vis,storage"
# Runs the README's ```pycon blocks as one doctest, with the flags tests/test_docs_site.py uses.
QUICKSTART_RUNNER = """\
import doctest, sys
source = open(sys.argv[1]).read()
test = doctest.DocTestParser().get_doctest(source, {"__name__": "README"}, "README.md", "README.md", 0)
result = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE).run(test)
print(f"{result.failed} failed of {result.attempted}")
sys.exit(1 if result.failed or not result.attempted else 0)
"""

pytestmark = pytest.mark.heavy


class Installed(NamedTuple):
    """The built wheel and the fresh venv it is installed in."""

    wheel: Path  # the .whl file
    python: Path  # the venv's interpreter
    workdir: Path  # an empty folder outside the checkout, to run the venv's Python in


def _source_files() -> dict[str, Path]:
    """Every file of the three package folders, by the path it has in the wheel.

    git names them (tracked, or new and not ignored), so caches and ignored outputs stay out;
    a checkout without git falls back to every file but bytecode caches.
    """
    folders = list(INSTALLED_AS)
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *folders],
                            cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0:
        paths = [ROOT / name for name in listed.stdout.split("\0") if name]
    else:
        paths = [p for folder in folders for p in (ROOT / folder).rglob("*") if "__pycache__" not in p.parts]
    files = {}
    for path in paths:
        if path.is_file():  # git still lists a tracked file deleted in the work tree
            folder, rest = path.relative_to(ROOT).as_posix().split("/", 1)
            files[f"{INSTALLED_AS[folder]}/{rest}"] = path
    return files


def _module_names(files: dict[str, Path]) -> list[str]:
    """The import name of every module of every package among `files` (a folder with `__init__.py`
    whose parents are packages too), `__main__` left out: importing it would run the command line."""
    packages = {name.rsplit("/", 1)[0] for name in files if name.endswith("/__init__.py")}
    modules = []
    for name in sorted(files):
        folder, _, file = name.rpartition("/")
        parents = [folder.rsplit("/", depth)[0] for depth in range(folder.count("/") + 1)]
        if file.endswith(".py") and file != "__main__.py" and all(p in packages for p in parents):
            module = f"{folder}/{file.removesuffix('.py')}".removesuffix("/__init__")
            modules.append(module.replace("/", "."))
    return modules


def _run(command: list[str], cwd: Path, what: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """Run `command` with no PYTHONPATH (nothing of the checkout on the path); fail naming `what`."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["PYTHONNOUSERSITE"] = "1"
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{what} failed ({' '.join(command)}):\n{(done.stdout + done.stderr)[-6000:]}"
    return done


def _build_wheel(build: Path) -> Path:
    """`pip wheel --no-deps` of a copy of the checkout's build files and package folders, so the
    build writes nothing (build/, *.egg-info) into the checkout."""
    source = _mkdir(build / "source")
    for name in BUILD_FILES:
        shutil.copy2(ROOT / name, source / name)
    for path in _source_files().values():
        target = source / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    # An absolute path: pip reads a bare folder name as a package to fetch from the index.
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(build / "dist"),
          str(source.resolve())], build, "building the wheel")
    (wheel,) = (build / "dist").glob("torchlog-*.whl")
    return wheel


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """The wheel, built and installed with its extras into a new venv without system site-packages
    (so a missing dependency shows); pip runs from the suite's venv (`pip --python`)."""
    base = tmp_path_factory.mktemp("wheel")
    wheel = _build_wheel(base)
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base, "creating the venv")
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    # torch alone first, at the suite's own version, so the wheel's `torch>=2.1` never picks one.
    pinned = f"torch=={torch.__version__.split('+')[0]}"
    _run([*pip, pinned], base, "installing torch")
    _run([*pip, f"{wheel}[{EXTRAS}]", pinned], base, f"installing the wheel with [{EXTRAS}]")
    return Installed(wheel, python, _mkdir(base / "work"))


def test_the_wheel_holds_every_file_of_the_package_folders_and_nothing_else(installed: Installed) -> None:
    expected = set(_source_files())
    with zipfile.ZipFile(installed.wheel) as wheel:
        held = {n for n in wheel.namelist() if not n.split("/", 1)[0].endswith(".dist-info")}
    assert not expected - held, f"the wheel lacks {sorted(expected - held)}: see setup.py and setup.cfg's package_data"
    assert not held - expected, f"the wheel holds files the checkout does not: {sorted(held - expected)}"
    assert {"torchlog/vis/viewer/assets/page.html", "torchlog/vis/viewer/vendor/graphviz.js"} <= held


def test_every_module_imports_from_the_installed_wheel(installed: Installed) -> None:
    modules = _module_names(_source_files())
    assert {"torchlog", "torchlog.interventions", "torchlog.vis.viewer", "torchlog.storage"} <= set(modules)
    script = ("import importlib, sys\n"
              "for name in sys.argv[1:]:\n"
              "    module = importlib.import_module(name)\n"
              "    assert '/site-packages/' in module.__file__, (name, module.__file__)\n"
              "print(len(sys.argv) - 1, 'modules')\n")
    done = _run([str(installed.python), "-c", script, *modules], installed.workdir, "importing the installed modules")
    assert done.stdout.strip() == f"{len(modules)} modules"


def test_the_viewer_assets_are_installed_beside_the_viewer(installed: Installed) -> None:
    script = ("import pathlib, torchlog.vis.viewer as v\n"
              "root = pathlib.Path(v.__file__).parent\n"
              "print('\\n'.join(sorted(p.relative_to(root).as_posix() for p in root.glob('*/*') "
              "if p.parent.name in ('assets', 'vendor') and p.is_file())))\n")
    done = _run([str(installed.python), "-c", script], installed.workdir, "listing the installed assets")
    prefix = "torchlog/vis/viewer/"
    expected = sorted(n.removeprefix(prefix) for n in _source_files()
                      if n.startswith((prefix + "assets/", prefix + "vendor/")))
    assert len(expected) > 10 and done.stdout.split() == expected


def test_the_readme_quickstart_runs_against_the_installed_wheel(installed: Installed) -> None:
    blocks = EXAMPLE_BLOCK.findall((ROOT / "README.md").read_text())
    assert blocks, "the README has no ```pycon quickstart"
    (installed.workdir / "quickstart.txt").write_text("\n".join(blocks))
    (installed.workdir / "run_quickstart.py").write_text(QUICKSTART_RUNNER)
    done = _run([str(installed.python), "run_quickstart.py", "quickstart.txt"], installed.workdir,
                "the README's quickstart")
    assert done.stdout.strip().startswith("0 failed of "), done.stdout
    assert (installed.workdir / "model.html").stat().st_size > (ROOT / "vis/viewer/vendor/graphviz.js").stat().st_size
