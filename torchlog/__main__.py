"""Command line: `python -m torchlog demo | show FILE | layers FILE | render FILE`."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchlog", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="log the built-in example model and print its history")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from torchlog.demo import run_demo

        print(run_demo())
    return 0


if __name__ == "__main__":
    sys.exit(main())
