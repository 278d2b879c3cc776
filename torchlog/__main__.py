"""Command line: `python -m torchlog demo | show FILE | layers FILE | render FILE | view FILE |
netron FILE | extract ...`."""
from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["extract"]:
        return _extract(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m torchlog", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="log the built-in example model, print its history "
                               "and write its interactive viewer")
    demo.add_argument("--html", default="torchlog_demo.html",
                      help="where to write the viewer page (default: %(default)s)")
    _add_file_commands(commands)
    # Listed here; its options live with torchlog.datasets, imported only when it runs.
    commands.add_parser("extract", help="save chosen layers over a dataset into one array per "
                        "layer, also under torchrun (see extract --help)")
    _add_view_command(commands)
    from torchlog.export.netron_command import add_netron_command, run_netron

    add_netron_command(commands)
    args = parser.parse_args(argv)
    if args.command == "netron":
        import torchlog

        return run_netron(args, torchlog.load)
    if args.command == "demo":
        from torchlog.demo import run_demo

        print(run_demo(args.html))
        return 0
    if args.command == "view":
        return _view(args)
    return _run_file_command(args)


def _extract(argv: list[str]) -> int:
    """`python -m torchlog extract ...`, parsed and run by torchlog.datasets."""
    from torchlog.errors import MissingDependencyError
    from torchlog.optional import require

    try:
        require("torchlog.storage.extraction", "extract")  # h5py, checked before anything runs
    except MissingDependencyError as exc:
        print(f"torchlog: error: {exc}", file=sys.stderr)
        return 1
    from torchlog.datasets.extract_command import main

    return main(argv)


def _add_view_command(commands: argparse._SubParsersAction) -> None:
    view = commands.add_parser("view", help="write the interactive viewer of a log file (run.h5) "
                               "as one HTML file, or serve it on 127.0.0.1 with --serve")
    view.add_argument("file")
    view.add_argument("-o", "--output", default=None,
                      help="HTML file to write (default: the log's name with .html)")
    view.add_argument("--mode", choices=("unrolled", "rolled"), default=None,
                      help="the view it opens with (default: chosen by size)")
    view.add_argument("--depth", type=int, default=None,
                      help="modules this deep are drawn as one node (default: readable)")
    view.add_argument("--serve", action="store_true",
                      help="serve the page on http://127.0.0.1 until Ctrl-C")
    view.add_argument("--port", type=int, default=0, help="port for --serve (default: any free)")


def _view(args: argparse.Namespace) -> int:
    """`python -m torchlog view run.h5`: load lazily, write the page, optionally serve it."""
    import threading
    from pathlib import Path

    import torchlog
    from torchlog.errors import TorchlogError

    output = args.output or str(Path(args.file).with_suffix(".html"))
    try:
        written = torchlog.load(args.file).to_html(output, args.mode, args.depth)
    except TorchlogError as exc:
        print(f"torchlog: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {written}")
    if args.serve:
        from torchlog.vis.viewer import serve_page

        server = serve_page(written, args.port)
        print(f"serving the viewer at {server.url} (Ctrl-C stops)", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            print("stopped serving")
        finally:
            server.shutdown()
            server.server_close()
    return 0


def _add_file_commands(commands: argparse._SubParsersAction) -> None:
    show = commands.add_parser("show", help="print the summary of a log file (run.h5)")
    show.add_argument("file")
    layers = commands.add_parser("layers", help="list the layers of a log or extract file with shapes")
    layers.add_argument("file")
    layers.add_argument("keys", nargs="*", help="only the layers these name: labels, or for an "
                        "extract file the --layers entries it was made with (e.g. fc1)")
    render = commands.add_parser("render", help="render the graph of a log file with graphviz")
    render.add_argument("file")
    render.add_argument("--rolled", action="store_true", help="one node per layer, not per pass")
    render.add_argument("-o", "--output", required=True, help="output file, e.g. graph.svg")
    render.add_argument("--format", default=None, help="pdf, png, svg... (default: from -o's suffix)")


def _run_file_command(args: argparse.Namespace) -> int:
    from torchlog.errors import MissingDependencyError, TorchlogError
    from torchlog.optional import require

    try:
        cli = require("torchlog.storage.cli", "reading log files")  # lazily: h5py is optional
    except MissingDependencyError as exc:
        print(f"torchlog: error: {exc}", file=sys.stderr)
        return 1
    try:
        print(cli.run(args.command, args))
    except TorchlogError as exc:
        print(f"torchlog: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
