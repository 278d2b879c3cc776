"""Command line: `python -m torchlog demo | show FILE | layers FILE | render FILE`."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchlog", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="log the built-in example model and print its history")
    _add_file_commands(commands)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from torchlog.demo import run_demo

        print(run_demo())
        return 0
    return _run_file_command(args)


def _add_file_commands(commands: argparse._SubParsersAction) -> None:
    show = commands.add_parser("show", help="print the summary of a log file (run.h5)")
    show.add_argument("file")
    layers = commands.add_parser("layers", help="list the layers of a log or extract file with shapes")
    layers.add_argument("file")
    render = commands.add_parser("render", help="render the graph of a log file with graphviz")
    render.add_argument("file")
    render.add_argument("--rolled", action="store_true", help="one node per layer, not per pass")
    render.add_argument("-o", "--output", required=True, help="output file, e.g. graph.svg")
    render.add_argument("--format", default=None, help="pdf, png, svg... (default: from -o's suffix)")


def _run_file_command(args: argparse.Namespace) -> int:
    from torchlog.errors import TorchlogError

    try:
        from torchlog.storage import cli  # lazily: h5py is an optional extra
    except ImportError as exc:
        print(f"torchlog: error: log files need h5py ({exc}); pip install torchlog[storage]",
              file=sys.stderr)
        return 1
    try:
        print(cli.run(args.command, args))
    except TorchlogError as exc:
        print(f"torchlog: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
