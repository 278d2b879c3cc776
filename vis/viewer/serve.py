"""A small local web server for one viewer page, bound to 127.0.0.1 only."""
from __future__ import annotations

import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

__all__ = ["PageServer", "serve_page"]

LOOPBACK = "127.0.0.1"


class PageServer(ThreadingHTTPServer):
    """Serves one HTML file at `/` (and nothing else) to this machine only."""

    daemon_threads = True

    def __init__(self, page: Path, port: int = 0) -> None:
        self.page = Path(page)
        super().__init__((LOOPBACK, port), _PageHandler)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.server_address[1]}/"

    def start(self) -> threading.Thread:
        """Serve from a background thread; call `shutdown()` to stop."""
        thread = threading.Thread(target=self.serve_forever, name="torchlog-viewer", daemon=True)
        thread.start()
        return thread


class _PageHandler(BaseHTTPRequestHandler):
    server: PageServer

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
        if self.path.split("?")[0] not in ("/", "/index.html"):
            self.send_error(HTTPStatus.NOT_FOUND, "this server only serves the viewer page at /")
            return
        body = self.server.page.read_bytes()
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return  # a viewer in a terminal should not print a line per request


def serve_page(page: str | Path, port: int = 0) -> PageServer:
    """Start serving `page` on 127.0.0.1 (`port` 0 picks a free one) and return the server.

    Raises:
        OSError: the port is taken.

    Example:
        >>> import tempfile, urllib.request
        >>> with tempfile.NamedTemporaryFile("w", suffix=".html", delete=False) as f:
        ...     _ = f.write("<p>hi</p>")
        >>> server = serve_page(f.name)
        >>> urllib.request.urlopen(server.url).read()
        b'<p>hi</p>'
        >>> server.shutdown(); server.server_close()
    """
    server = PageServer(Path(page), port)
    server.start()
    return server
