"""Refresh the vendored Graphviz-in-WebAssembly build from the npm registry (run by hand).

    python vis/viewer/vendor/refresh.py            # the pinned versions below
    python vis/viewer/vendor/refresh.py --check    # only verify the files against VERSIONS.json

`@hpcc-js/wasm-graphviz` ships an ES module; pages shown in notebooks cannot rely on module
scripts or blob URLs, so its one `export {...}` statement becomes a global
(`globalThis.torchlogGraphviz`) inside a function wrapper. Nothing else in the file changes.
The licence texts come from the package itself (Apache-2.0) and from `spdx-license-list`
(Graphviz's EPL-1.0, compiled into the WebAssembly).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GRAPHVIZ_PACKAGE = ("@hpcc-js/wasm-graphviz", "1.29.2")
LICENCE_PACKAGE = ("spdx-license-list", "6.12.0")
BUNDLE = "graphviz.js"
LICENCES = {"LICENSE.hpcc-js-wasm.txt": "Apache-2.0", "LICENSE.graphviz.txt": "EPL-1.0"}
VERSIONS = "VERSIONS.json"
_EXPORT = re.compile(r"export\s*\{([^}]*)\}\s*;?\s*(//# sourceMappingURL=\S*\s*)?$")


def _unpack(name: str, version: str, work: Path) -> Path:
    """`npm pack` one pinned package into `work` and return its unpacked folder."""
    done = subprocess.run(["npm", "pack", f"{name}@{version}", "--pack-destination", str(work)],
                          capture_output=True, text=True, check=True)
    tarball = work / done.stdout.strip().splitlines()[-1]
    target = work / tarball.stem
    with tarfile.open(tarball) as archive:
        archive.extractall(target, filter="data")
    return target / "package"


def as_classic_script(module_source: str) -> str:
    """Turn the bundle's trailing `export {a as B, ...}` into a global object.

    Raises:
        ValueError: the bundle no longer ends with one export statement (the upstream build
            changed; look at it before vendoring).
    """
    match = _EXPORT.search(module_source)
    if match is None:
        raise ValueError("the bundle does not end with an `export {...}` statement")
    pairs = [part.split(" as ") for part in match[1].split(",")]
    members = ", ".join(f"{alias.strip()}: {local.strip()}" for local, alias in pairs)
    body = module_source[:match.start()]
    return f'(function () {{\n"use strict";\n{body}\nglobalThis.torchlogGraphviz = {{{members}}};\n}})();\n'


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def refresh() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        graphviz = _unpack(*GRAPHVIZ_PACKAGE, work)
        licences = _unpack(*LICENCE_PACKAGE, work)
        source = (graphviz / "dist" / "index.js").read_text(encoding="utf-8")
        (HERE / BUNDLE).write_text(as_classic_script(source), encoding="utf-8")
        (HERE / "LICENSE.hpcc-js-wasm.txt").write_text(
            (graphviz / "LICENSE").read_text(encoding="utf-8"), encoding="utf-8")
        epl = json.loads((licences / "licenses" / "EPL-1.0.json").read_text(encoding="utf-8"))
        (HERE / "LICENSE.graphviz.txt").write_text(epl["licenseText"], encoding="utf-8")
    record = {"packages": {GRAPHVIZ_PACKAGE[0]: GRAPHVIZ_PACKAGE[1],
                           LICENCE_PACKAGE[0]: LICENCE_PACKAGE[1]},
              "licences": LICENCES,
              "sha256": {name: _digest(HERE / name) for name in (BUNDLE, *LICENCES)}}
    (HERE / VERSIONS).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def check() -> list[str]:
    """Names of vendored files whose content no longer matches VERSIONS.json."""
    record = json.loads((HERE / VERSIONS).read_text(encoding="utf-8"))
    return [name for name, digest in record["sha256"].items()
            if not (HERE / name).exists() or _digest(HERE / name) != digest]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="verify, do not download")
    if parser.parse_args().check:
        bad = check()
        print("vendored files match VERSIONS.json" if not bad else f"changed: {', '.join(bad)}")
        return 1 if bad else 0
    refresh()
    print(f"vendored {GRAPHVIZ_PACKAGE[0]}@{GRAPHVIZ_PACKAGE[1]} into {HERE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
