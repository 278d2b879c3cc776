"""The structural claims of docs/design.md, checked against the code.

The layer table and the import rules between packages are checked by tests/test_layering.py;
this file checks the rest: what each front end imports, the layers inside capture/, which
modules receive the user's model, which change process state, and what a plugin may call.
"""
from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "design.md"
# Where each installed package's source lives (setup.cfg's package_dir).
SOURCES = {"torchlog": ROOT / "torchlog", "torchlog.vis": ROOT / "vis", "torchlog.storage": ROOT / "storage"}
PLUGIN_FOLDER = "capture/triton/"  # the one capture plugin the page describes

# Calls that change state outside torchlog's own objects: the process-state table must list
# every module making one. Method names (any receiver) and plain function names:
STATE_METHODS = {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
                 "register_full_backward_pre_hook", "register_hook", "set_rng_state",
                 "set_rng_state_all", "manual_seed_all", "set_num_threads", "set_stance",
                 "saved_tensors_hooks", "setstate", "set_state"}
STATE_FUNCTIONS = {"register_module_forward_hook", "register_module_forward_pre_hook", "mallopt"}
STATE_DOTTED = {"gc.disable", "gc.enable", "random.seed", "np.random.seed", "numpy.random.seed"}
CLASS_PATCHES = {"__getitem__", "__setitem__", "__call__", "__init__", "__torch_function__"}  # cls.X = ...


def _page() -> str:
    return PAGE.read_text()


def _block(name: str) -> list[list[str]]:
    """The entries of the ```name fenced block: one list of words per entry, a line that
    starts with a space continuing the entry above it."""
    found = re.search(rf"^```{re.escape(name)}\n(.*?)^```", _page(), re.S | re.M)
    assert found, f"docs/design.md has no ```{name} block"
    entries: list[list[str]] = []
    for line in found.group(1).splitlines():
        if line[:1].isspace() and entries:
            entries[-1].extend(line.split())
        elif line.strip():
            entries.append(line.split())
    return entries


def _modules() -> dict[str, Path]:
    """Every module of the installed packages by dotted name, vendored files left out."""
    found: dict[str, Path] = {}
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if "vendor" in parts or (package == "torchlog" and parts[0] in ("vis", "storage")):
                continue
            found[".".join((package, *parts)).removesuffix(".__init__")] = path
    return found


def _short(name: str) -> str:
    """A module's name as the page writes it: relative to torchlog, `__init__` for the top."""
    return "__init__" if name == "torchlog" else name.removeprefix("torchlog.")


def _covers(entry: str, short: str) -> bool:
    """Whether a page entry (a module or a package) names the module `short`."""
    return short == entry or short.startswith(entry + ".")


def _is_type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, runtime_only: bool = False) -> set[str]:
    """The torchlog modules `path` imports, anywhere in it (`require("torchlog....")` counts);
    with `runtime_only`, imports under `if TYPE_CHECKING:` are left out."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if runtime_only and _is_type_checking(child):
                continue
            if isinstance(child, ast.Import):
                found.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                found.add(child.module)
            elif (isinstance(child, ast.Call) and getattr(child.func, "id", None) == "require"
                  and child.args and isinstance(child.args[0], ast.Constant)):
                found.add(str(child.args[0].value))
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name.split(".")[0] == "torchlog"}


def test_each_front_end_imports_what_the_page_says() -> None:
    modules = _modules()
    for front_end, *listed in _block("front-end-imports"):
        package = f"torchlog.{front_end}"
        own = {n: p for n, p in modules.items() if n == package or n.startswith(package + ".")}
        assert own, f"the page lists imports of {front_end!r}, which is no package of torchlog"
        imported = {_short(target) for path in own.values() for target in _imports(path)
                    if not (target == package or target.startswith(package + "."))}
        assert imported == set(listed), (
            f"docs/design.md's ```front-end-imports says {front_end} imports {sorted(listed)}; "
            f"the code imports {sorted(imported)} (missing from the page: "
            f"{sorted(imported - set(listed))}, not imported: {sorted(set(listed) - imported)})")


def test_capture_modules_import_only_their_own_layer_or_lower() -> None:
    layers = {name: int(number) for number, *names in _block("capture-layers") for name in names}
    capture = {n.removeprefix("torchlog.capture").lstrip(".") or "__init__": p
               for n, p in _modules().items() if n.startswith("torchlog.capture")}
    missing = sorted(set(capture) - set(layers))
    assert not missing, f"capture modules {missing} are in no row of docs/design.md's ```capture-layers"
    wrong = []
    for name, path in sorted(capture.items()):
        for target in _imports(path, runtime_only=True):
            inner = target.removeprefix("torchlog.capture").lstrip(".")
            if target.startswith("torchlog.capture.") and layers.get(inner, -1) > layers[name]:
                wrong.append(f"capture.{name} (layer {layers[name]}) imports {target} (layer {layers[inner]})")
    assert not wrong, "imports against docs/design.md's ```capture-layers:\n" + "\n".join(wrong)


def _receives_the_model(tree: ast.AST) -> bool:
    """A function parameter named `model` or `named_modules`, or annotated with nn.Module."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
            if any(a.arg in ("model", "named_modules") or
                   (a.annotation is not None and "nn.Module" in ast.unparse(a.annotation))
                   for a in arguments):
                return True
    return False


def test_the_modules_that_receive_the_model_are_the_ones_the_page_lists() -> None:
    listed = [name for entry in _block("model-access") for name in entry]
    receiving = sorted(_short(n) for n, p in _modules().items() if _receives_the_model(ast.parse(p.read_text())))
    unlisted = [m for m in receiving if not any(_covers(e, m) for e in listed)]
    stale = [e for e in listed if not any(_covers(e, m) for m in receiving)]
    assert not unlisted, f"{unlisted} receive the user's model but docs/design.md's ```model-access omits them"
    assert not stale, f"docs/design.md's ```model-access names {stale}, which never receive the model"


def _state_changes(tree: ast.AST) -> Iterator[str]:
    """What in `tree` changes state outside torchlog's objects, as source text."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            dotted = ast.unparse(func)
            if isinstance(func, ast.Attribute) and (
                    func.attr in STATE_METHODS or dotted in STATE_DOTTED
                    # a global generator, not a Generator made on the spot
                    or (func.attr == "manual_seed" and not isinstance(func.value, ast.Call))):
                yield dotted
            elif isinstance(func, ast.Name) and func.id in STATE_FUNCTIONS:
                yield dotted
        elif isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("TorchFunctionMode")
                                                    for b in node.bases):
            yield f"class {node.name}(TorchFunctionMode)"
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr in CLASS_PATCHES:
                    yield ast.unparse(target)  # a class's method replaced
                if (isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant)
                        and target.slice.value == "forward"):
                    yield ast.unparse(target)  # an instance's forward replaced


def _state_table_modules() -> set[str]:
    """Dotted module names from the first column of the process-state table."""
    section = _page().split("| Module | What changes | How it is restored |", 1)
    assert len(section) == 2, "docs/design.md has no process-state table"
    rows = re.findall(r"^\| `([\w/]+\.py)`", section[1].split("\n\n", 1)[0], re.M)
    names = set()
    for row in rows:
        package, _, rest = row.partition("/")
        if package in ("storage", "vis"):
            names.add(f"torchlog.{package}." + rest.removesuffix(".py").replace("/", "."))
        else:
            names.add("torchlog." + row.removesuffix(".py").replace("/", "."))
    return names


def test_every_module_that_changes_process_state_is_in_the_table() -> None:
    table = _state_table_modules()
    modules = _modules()
    assert table and table <= set(modules), f"the table names missing modules {sorted(table - set(modules))}"
    unlisted = {name: sorted(set(_state_changes(ast.parse(path.read_text()))))
                for name, path in sorted(modules.items()) if name not in table}
    unlisted = {name: found for name, found in unlisted.items() if found}
    assert not unlisted, f"modules changing process state missing from docs/design.md's table: {unlisted}"


def test_plugins_use_only_the_recorder_members_the_page_names() -> None:
    bullet = re.search(r"^- \*plugins\*(.*?)(?=^- |^\n)", _page(), re.S | re.M)
    assert bullet and PLUGIN_FOLDER in bullet.group(1), "the page's plugins bullet is gone or names no plugin"
    allowed = set(re.findall(r"`Recorder\.(\w+)`", bullet.group(1)))
    used = set()
    for path in (ROOT / "torchlog" / PLUGIN_FOLDER).rglob("*.py"):
        used.update(node.attr for node in ast.walk(ast.parse(path.read_text()))
                    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id == "recorder")
    assert used, f"no recorder use found in {PLUGIN_FOLDER}: the check reads the wrong files"
    assert used <= allowed, (f"{PLUGIN_FOLDER} uses Recorder members {sorted(used - allowed)} "
                             f"that docs/design.md's plugins bullet does not name")


def test_a_history_offers_no_way_to_change_its_passes() -> None:
    import torchlog

    history = torchlog.log_forward_pass(torch.nn.Linear(2, 2), torch.ones(1, 2))
    with pytest.raises(TypeError):
        history[0] = history[1]  # type: ignore[index]
    with pytest.raises(TypeError):
        del history[0]  # type: ignore[attr-defined]
    assert not hasattr(history, "append") and not hasattr(history, "insert")


def test_the_paths_where_new_code_goes_exist() -> None:
    section = _page().split("## Where new code goes", 1)
    assert len(section) == 2, "docs/design.md has no 'Where new code goes' section"
    paths = re.findall(r"`((?:torchlog|storage|vis|tests|docs)/[\w/.]*|setup\.cfg)`",
                       section[1].split("\n## ", 1)[0])
    assert len(paths) >= 5, f"the section names too few paths: {paths}"
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, f"docs/design.md says new code goes in {missing}, which do not exist"


def _function_level_imports(function: ast.AST) -> set[str]:
    """The torchlog modules imported inside `function` (`require("torchlog....")` counts)."""
    found = set()
    for node in ast.walk(function):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "require"
              and node.args and isinstance(node.args[0], ast.Constant)):
            found.add(str(node.args[0].value))
    return {name for name in found if name.split(".")[0] == "torchlog"}


def test_history_reaches_other_packages_only_from_the_conveniences_the_page_lists() -> None:
    """The history is a container: its methods that call into another package are the closed
    list of ```history-conveniences, each one call of that package's function."""
    tree = ast.parse((ROOT / "torchlog" / "history.py").read_text())
    history = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ModelHistory")
    reached: dict[str, set[str]] = {}
    for method in history.body:
        if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for target in _function_level_imports(method):
                package = target.removeprefix("torchlog.").split(".")[0]
                reached.setdefault(package, set()).add(method.name)
    listed = {package: set(methods) for package, *methods in _block("history-conveniences")}
    assert reached == listed, (f"docs/design.md's ```history-conveniences lists {listed}; the methods of "
                               f"ModelHistory that import another package are {reached}")
    for package, methods in reached.items():
        for method in methods:
            body = next(m for m in history.body if getattr(m, "name", None) == method).body
            calls = [n for n in body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
            assert len(calls) <= 2, f"ModelHistory.{method} does more than call {package}'s function"


def _reversed_copy(history):
    """A new ModelHistory of `history`'s records with the passes in reverse order: broken."""
    from torchlog.history import ModelHistory

    return ModelHistory(list(reversed(history)), history.layers, history.modules, history.info)


def test_every_history_built_while_a_test_runs_is_linted_as_it_is_built(request: pytest.FixtureRequest) -> None:
    import torchlog
    from tests.invariants import TALLY

    claim = ("The test suite lints every `ModelHistory` built while a test, a docstring example, a "
             "page's example or a tutorial runs, as it is built")
    assert claim in " ".join(_page().split()), f"docs/design.md no longer says {claim!r}"
    assert request.config.pluginmanager.has_plugin("torchlog_lint_plugin"), "torchlog_lint_plugin.py is not loaded"
    history = torchlog.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()),
                                        torch.ones(1, 2))
    checked = TALLY.histories
    with pytest.raises(torchlog.LintError, match="not in execution order") as info:
        _reversed_copy(history)
    notes = "".join(info.value.__notes__)
    assert "no_lint" in notes and "ModelHistory of Sequential" in notes and TALLY.histories == checked + 1
    # Kept for the fixture's teardown, which fails a test whose LintError torchlog caught; this
    # one raised it on purpose.
    assert len(TALLY.failures) == 1 and "not in execution order" in TALLY.failures[0]
    TALLY.failures.clear()


def test_the_lint_reaches_what_the_page_says() -> None:
    """The wiring behind the claim: what loads the plugin, which folders `make test` runs docstring
    examples of, and that the tutorial runner installs the lint. (The behaviour, a broken history
    failing its run, is tested in tests/test_lint_plugin.py, tests/test_tutorials.py and
    tests/test_docs_site.py.)"""
    import configparser
    import shlex

    text = " ".join(_page().split())
    ini = configparser.ConfigParser()
    ini.read(ROOT / "setup.cfg")
    addopts = shlex.split(ini["tool:pytest"]["addopts"])
    assert "--doctest-modules" in addopts and "-p torchlog_lint_plugin" in " ".join(addopts), (
        f"setup.cfg's addopts {addopts} do not run docstring examples with torchlog_lint_plugin.py, as "
        f"docs/design.md says (`-p torchlog_lint_plugin`, `--doctest-modules`)")
    assert "`-p torchlog_lint_plugin`" in text and "`tests/conftest.py` names" in text
    conftest = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    named = [ast.literal_eval(n.value) for n in conftest.body if isinstance(n, ast.Assign)
             and any(getattr(t, "id", None) == "pytest_plugins" for t in n.targets)]
    assert named and "torchlog_lint_plugin" in named[0], (
        "tests/conftest.py's pytest_plugins omits torchlog_lint_plugin")
    recipe = re.search(r"^test:.*\n\t(.*)$", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, "the Makefile has no test target"
    folders = re.findall(r"`(torchlog|vis|storage)/`", text.split("--doctest-modules", 1)[1].split(";", 1)[0])
    assert sorted(folders) == ["storage", "torchlog", "vis"], f"the page's list of doctest folders: {folders}"
    missing = [f for f in folders if f not in recipe.group(1).split()]
    assert not missing, f"docs/design.md says docstring examples of {missing} are linted; `make test` runs {recipe.group(1)!r}"
    runner = (ROOT / "tests" / "test_tutorials.py").read_text()
    assert "lint_from_now_on()" in runner and "lint_summary()" in runner, (
        "tests/test_tutorials.py no longer installs the lint in the tutorials' processes")


def test_tests_mirror_the_sources() -> None:
    """Each package of torchlog/, vis/ and storage/ has its folder of tests, and each folder of
    tests a package, as "Where new code goes" says."""
    text = _page()
    assert "`tests/` mirrors the sources" in text
    pairs = [(ROOT / "torchlog", ROOT / "tests" / "torchlog"), (ROOT / "vis", ROOT / "tests" / "vis"),
             (ROOT / "storage", ROOT / "tests" / "storage")]
    for source, tests in pairs:
        assert any(tests.glob("test_*.py")), f"{tests.relative_to(ROOT)} holds no tests of {source.name}/"
    packages = sorted(p.name for p in (ROOT / "torchlog").iterdir() if (p / "__init__.py").is_file())
    folders = sorted(p.name for p in (ROOT / "tests" / "torchlog").iterdir()
                     if p.is_dir() and any(p.glob("test_*.py")))
    assert packages == folders, (
        f"torchlog's packages {packages} and the test folders of tests/torchlog/ {folders} differ: a "
        "package's tests go in tests/torchlog/<package>/, and a folder of tests names a package")
    for package in packages:
        assert f"`tests/torchlog/{package}/`" in text, f"docs/design.md does not list tests/torchlog/{package}/"
    stray = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                   if p.parent.relative_to(ROOT / "tests").parts[:1] not in ((), ("torchlog",), ("vis",), ("storage",)))
    assert not stray, f"test files outside the mirror of the sources: {stray}"


@pytest.mark.no_lint("builds a history with its passes reversed, to show that the marker lets it through")
def test_no_lint_lets_a_test_build_a_broken_history() -> None:
    import torchlog

    history = torchlog.log_forward_pass(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()),
                                        torch.ones(1, 2))
    broken = _reversed_copy(history)
    with pytest.raises(torchlog.LintError, match="not in execution order"):
        torchlog.lint(broken)
