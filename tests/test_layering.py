"""The import layering that docs/design.md states: read from its `layers` table, checked on every module."""
from __future__ import annotations

import ast
import functools
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where each installed package's source lives (setup.cfg's package_dir).
SOURCES = {"torchlog": ROOT / "torchlog", "torchlog.vis": ROOT / "vis", "torchlog.storage": ROOT / "storage"}
FRONT_ENDS = ("torchlog.vis", "torchlog.storage", "torchlog.export")
OPTIONAL = ("graphviz", "h5py", "pandas", "IPython", "networkx", "selenium", "tensorboard",
            "tensorboardX", "onnx", "netron")
# Function-level imports allowed to reach a higher layer: (importer, imported), as the page lists.
UPWARD_ENTRY_POINTS = {
    ("torchlog.records", "torchlog.display"),
    ("torchlog.history", "torchlog.display"),
    ("torchlog.history", "torchlog.gradients"),
    ("torchlog.history", "torchlog.vis"),
    ("torchlog.history", "torchlog.storage"),
    ("torchlog.history", "torchlog.export"),
    ("torchlog.arguments", "torchlog.vis"),
    ("torchlog.api", "torchlog.storage"),
    ("torchlog.generation.saving", "torchlog.storage"),
    ("torchlog.generation.history", "torchlog.vis"),
    ("torchlog.datasets.extraction", "torchlog.storage"),
    ("torchlog.datasets.results", "torchlog.storage"),
    ("torchlog.datasets.checkpoint", "torchlog.storage"),
    ("torchlog.patching.result", "torchlog.vis"),
}


def _layer_table() -> dict[str, int]:
    """Module or package name -> layer number, from the ```layers block of docs/design.md."""
    page = (ROOT / "docs" / "design.md").read_text()
    block = re.search(r"^```layers\n(.*?)^```", page, re.S | re.M)
    assert block, "docs/design.md has no ```layers table"
    table: dict[str, int] = {}
    for line in block.group(1).splitlines():
        number, *names = line.split()
        for name in names:
            table["torchlog" if name == "__init__" else f"torchlog.{name}"] = int(number)
    return table


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of the installed packages, by dotted name (vendored files left out)."""
    found: dict[str, Path] = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if "vendor" in parts or (package == "torchlog" and parts[0] in ("vis", "storage")):
                continue
            name = ".".join((package, *parts)).removesuffix(".__init__")
            found[name] = path
    return found


def _layer_of(name: str, table: dict[str, int]) -> int | None:
    """The layer of a module: its own entry, or that of the closest package listed."""
    while name:
        if name in table:
            return table[name]
        name = name.rpartition(".")[0]
    return None


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(imported torchlog module, whether at module level) for each import in `path`.

    Imports under `if TYPE_CHECKING:` count as module level; `require("torchlog...")` calls
    (optional extras) count as function level, like the imports they stand for.
    """
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                found.extend((alias.name, inner) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.append((child.module, inner))
            elif (isinstance(child, ast.Call) and getattr(child.func, "id", None) == "require"
                  and child.args and isinstance(child.args[0], ast.Constant)):
                found.append((str(child.args[0].value), False))
            visit(child, inner)

    visit(ast.parse(path.read_text()), True)
    return [(name, top) for name, top in found if name.split(".")[0] == "torchlog"]


def _front_end(name: str) -> str | None:
    return next((f for f in FRONT_ENDS if name == f or name.startswith(f + ".")), None)


def test_every_module_has_a_layer_on_the_design_page() -> None:
    table = _layer_table()
    missing = sorted(name for name in _modules() if _layer_of(name, table) is None)
    assert not missing, f"modules {missing} are in no layer of docs/design.md's ```layers table"


def test_no_module_imports_one_from_a_higher_layer() -> None:
    table = _layer_table()
    wrong = []
    for name, path in sorted(_modules().items()):
        here = _layer_of(name, table)
        for target, top in _imports(path):
            there = _layer_of(target, table)
            if here is None or there is None or there <= here:
                continue
            entry = next((t for i, t in UPWARD_ENTRY_POINTS if i == name and
                          (target == t or target.startswith(t + "."))), None)
            if top or entry is None:
                wrong.append(f"{name} (layer {here}) imports {target} (layer {there})"
                             + ("" if top else " inside a function"))
    assert not wrong, "imports against the layering of docs/design.md:\n" + "\n".join(wrong)


def test_front_ends_never_import_one_another() -> None:
    wrong = []
    for name, path in sorted(_modules().items()):
        mine = _front_end(name)
        for target, _ in _imports(path):
            theirs = _front_end(target)
            if mine and theirs and theirs != mine:
                wrong.append(f"{name} imports {target}")
    assert not wrong, "\n".join(wrong)


def test_the_allowed_upward_imports_are_the_ones_the_page_lists() -> None:
    page = (ROOT / "docs" / "design.md").read_text()
    for importer, target in UPWARD_ENTRY_POINTS:
        short = target.removeprefix("torchlog.")
        assert re.search(rf"`{importer.removeprefix('torchlog.')}` → [^;]*`{short}`", page), (
            f"docs/design.md does not list the function-level import {importer} -> {target}")


def _reaches_past_a_public_face(source: str, importer: str) -> list[str]:
    """What `source` (the module `importer`) imports against the two rules of public faces:
    outside torchlog/capture/, capture's names come from `torchlog.capture` itself, never
    from one of its modules; and no torchlog module's private (`_name`) names are imported
    or read through an imported module, whatever the level of the import."""
    tree = ast.parse(source)
    outside_capture = not (importer == "torchlog.capture" or importer.startswith("torchlog.capture."))
    wrong, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] != "torchlog":
                continue
            if outside_capture and node.module.startswith("torchlog.capture."):
                wrong.append(f"{importer} imports from {node.module} (line {node.lineno}): import from torchlog.capture")
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    wrong.append(f"{importer} imports the private name {node.module}.{alias.name} (line {node.lineno})")
                elif f"{node.module}.{alias.name}" in _modules():
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "torchlog":
                    continue
                if outside_capture and alias.name.startswith("torchlog.capture."):
                    wrong.append(f"{importer} imports {alias.name} (line {node.lineno}): import from torchlog.capture")
                modules[alias.asname or alias.name] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and ast.unparse(node.value) in modules):
            wrong.append(f"{importer} reads the private name {ast.unparse(node)} (line {node.lineno})")
    return wrong


def test_modules_use_public_faces_only() -> None:
    wrong = [problem for name, path in sorted(_modules().items())
             for problem in _reaches_past_a_public_face(path.read_text(), name)]
    assert not wrong, ("imports past a public face (make the name public where it is shared, or move it):\n"
                       + "\n".join(wrong))


def test_the_public_face_check_finds_each_kind_of_reach() -> None:
    source = ("from torchlog.capture.plan import OpPlan\n"
              "import torchlog.capture.nodes\n"
              "from torchlog.sites import planner\n"
              "def f():\n"
              "    from torchlog.sites.planner import _uses_position\n"
              "    return planner._uses_position\n")
    found = _reaches_past_a_public_face(source, "torchlog.api")
    assert [line.split(" (line")[0] for line in found] == [
        "torchlog.api imports from torchlog.capture.plan", "torchlog.api imports torchlog.capture.nodes",
        "torchlog.api imports the private name torchlog.sites.planner._uses_position",
        "torchlog.api reads the private name planner._uses_position"]
    assert _reaches_past_a_public_face(source.replace("_uses_position", "reached"), "torchlog.capture.run") == []


def test_importing_torchlog_loads_no_optional_dependency_or_front_end() -> None:
    code = ("import sys, torchlog\n"
            f"names = {OPTIONAL + FRONT_ENDS!r}\n"
            "print(' '.join(n for n in names if n in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == [], f"`import torchlog` loaded {done.stdout.split()}"
