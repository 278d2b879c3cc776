"""Serving a model file with the netron package's local web server, on 127.0.0.1 only."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from torchlog.errors import InvalidArgumentTypeError, LogFileNotFoundError
from torchlog.optional import require

__all__ = ["NetronServer", "serve_netron"]

HOST = "127.0.0.1"


@dataclass(frozen=True, slots=True)
class NetronServer:
    """A running Netron server; `stop()` ends it."""

    url: str  # 'http://127.0.0.1:PORT', the page that opens the file
    address: tuple[str, int]
    path: str  # the file served

    def stop(self) -> None:
        """Stop serving (the server's thread ends within a quarter second)."""
        require("netron", "serving a file with Netron").stop(self.address)


def serve_netron(path: str | os.PathLike, port: int = 0) -> NetronServer:
    """Serve `path` (an ONNX file from `history.to_onnx`) with Netron at http://127.0.0.1.

    The server runs in a background thread of this process; files beside `path` (the
    metrics attachment) are served too. Netron's page loads nothing from the internet.

    Args:
        path: the file to open.
        port: the port, 0 for any free one.

    Raises:
        MissingDependencyError: the netron package is missing (`pip install torchlog[onnx]`).
        LogFileNotFoundError: `path` does not exist.
        InvalidArgumentTypeError: `port` is not an int.

    Example:
        >>> import tempfile, torch, torchlog
        >>> h = torchlog.log_forward_pass(torch.nn.ReLU(), torch.ones(2))
        >>> server = serve_netron(h.to_onnx(f"{tempfile.mkdtemp()}/relu.onnx"))
        >>> server.url.startswith("http://127.0.0.1:")
        True
        >>> server.stop()
    """
    if isinstance(port, bool) or not isinstance(port, int):
        raise InvalidArgumentTypeError(f"port must be an int (0: any free port), got {port!r}")
    file = Path(path).expanduser()
    if not file.is_file():
        raise LogFileNotFoundError(f"cannot serve {str(path)!r} with Netron: no such file")
    netron = require("netron", "serving a file with Netron")
    address = netron.serve(str(file), None, address=(HOST, port), browse=False)
    return NetronServer(f"http://{address[0]}:{address[1]}", tuple(address), str(file))
