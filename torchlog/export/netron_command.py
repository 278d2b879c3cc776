"""`python -m torchlog netron run.h5`: write the log as ONNX and open it in Netron's local server."""
from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_netron_command", "run_netron"]


def add_netron_command(commands: argparse._SubParsersAction) -> None:
    """Register the `netron` subcommand on the CLI's subparsers."""
    netron = commands.add_parser(
        "netron", help="write a log file (run.h5) as ONNX with a metrics file and serve it with "
        "Netron on 127.0.0.1")
    netron.add_argument("file")
    netron.add_argument("-o", "--output", default=None,
                        help="ONNX file to write (default: the log's name with .onnx)")
    netron.add_argument("--port", type=int, default=0, help="port to serve on (default: any free)")
    netron.add_argument("--no-serve", action="store_true", help="write the files only")


def run_netron(args: argparse.Namespace, load: Callable[[str], Any],
               stop: threading.Event | None = None) -> int:
    """Run the command; serves until Ctrl-C (or until `stop` is set). Returns the exit status.

    `load` opens the log file (`torchlog.load`; passed in, since storage is another front
    end). Errors torchlog raises (a missing or foreign log file, a missing extra, an
    unwritable output) are printed as one line and give status 1.
    """
    from torchlog.errors import TorchlogError
    from torchlog.export.netron_metrics import metrics_path
    from torchlog.export.netron_server import serve_netron

    output = args.output or str(Path(args.file).with_suffix(".onnx"))
    try:
        written = load(args.file).to_onnx(output)
        print(f"wrote {written} and {metrics_path(written)}", flush=True)
        if args.no_serve:
            return 0
        server = serve_netron(written, args.port)
    except TorchlogError as exc:
        print(f"torchlog: error: {exc}", file=sys.stderr)
        return 1
    print(f"Netron shows the graph at {server.url} (Ctrl-C stops); open "
          f"{metrics_path(written).name} there too (Ctrl-O) for per-op metrics", flush=True)
    try:
        (stop or threading.Event()).wait()
    except KeyboardInterrupt:
        print("stopped serving")
    finally:
        server.stop()
    return 0
