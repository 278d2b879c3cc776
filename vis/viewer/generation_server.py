"""A generation's viewer served on 127.0.0.1: each step's page built when it is first opened.

`/` is the generation page (`generation_html(..., served=True)`: no step data in it),
`/step/<k>` step k's viewer page and `/site?key=<site>` a site's figures over the steps (JSON).
A generation too long to write into one page (`generation.EMBED_LIMIT_BYTES`) is read this way.
"""
from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

from torchlog.errors import TorchlogError
from torchlog.vis.viewer.generation import check_generation, generation_html, step_data_json
from torchlog.vis.viewer.page import fill_page
from torchlog.vis.viewer.serve import LOOPBACK
from torchlog.vis.viewer.step_sites import site_series

if TYPE_CHECKING:
    from torchlog.generation import GenerationHistory

__all__ = ["GenerationServer", "serve_generation"]

KEPT_STEP_PAGES = 4  # step pages kept built (each about 1 MB), the latest opened


class GenerationServer(ThreadingHTTPServer):
    """Serves one generation's viewer to this machine only; call `shutdown()` to stop."""

    daemon_threads = True

    def __init__(self, gen: "GenerationHistory", shell: str, mode: str | None, depth: int | None,
                 port: int = 0) -> None:
        self.gen, self.shell, self.mode, self.depth = gen, shell.encode("ascii"), mode, depth
        self._pages: OrderedDict[int, bytes] = OrderedDict()
        self._lock = threading.Lock()  # one page built at a time (the builder sets torch's thread count)
        super().__init__((LOOPBACK, port), _GenerationHandler)

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.server_address[1]}/"

    def step_page(self, step: int) -> bytes:
        """Step `step`'s viewer page, built on first use.

        Raises:
            StepNotFoundError: no such step.
        """
        step = self.gen.steps.index(step)
        with self._lock:
            if step not in self._pages:
                data = step_data_json(self.gen, step, self.mode, self.depth)
                self._pages[step] = str(fill_page(self.gen.model_name, data)).encode("ascii")
                while len(self._pages) > KEPT_STEP_PAGES:
                    self._pages.popitem(last=False)
            self._pages.move_to_end(step)
            return self._pages[step]

    def site(self, key: str) -> bytes:
        """`key`'s figures over the steps (JSON). Raises LayerNotFoundError: at no step."""
        with self._lock:
            return json.dumps(site_series(self.gen, key), allow_nan=False).encode("ascii")


class _GenerationHandler(BaseHTTPRequestHandler):
    server: GenerationServer

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
        url = urlsplit(self.path)
        path = url.path
        try:
            if path in ("/", "/index.html"):
                self._send(self.server.shell, "text/html; charset=utf-8")
            elif (step := re.fullmatch(r"/step/(-?\d+)", path)) is not None:
                self._send(self.server.step_page(int(step.group(1))), "text/html; charset=utf-8")
            elif path == "/site":
                key = parse_qs(url.query).get("key", [""])[0]
                self._send(self.server.site(key), "application/json")
            else:
                self._refuse(HTTPStatus.NOT_FOUND, f"{path!r} is not served here: the page is at /, steps at "
                                                   "/step/<k>, sites at /site?key=<site>")
        except TorchlogError as error:  # a step or site that is not there: said to the page
            self._refuse(HTTPStatus.NOT_FOUND, str(error.args[0] if error.args else error))

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _refuse(self, status: HTTPStatus, text: str) -> None:
        body = json.dumps({"error": text}).encode("ascii")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        return  # a viewer in a terminal should not print a line per request


def serve_generation(gen: "GenerationHistory", step: int = 0, site: str | None = None,
                     mode: str | None = None, depth: int | None = None,
                     token_text: Callable[[list[int]], str] | None = None, port: int = 0) -> GenerationServer:
    """Serve the viewer of `gen` on 127.0.0.1 (`port` 0 picks a free one) from a background
    thread and return the server (`server.url`; `server.shutdown()` stops it). Each step's
    page is built when it is first opened; the arguments are `generation_html`'s.

    Raises:
        OSError: the port is taken. Bad arguments raise as `generation_html` says.

    Example:
        >>> import torch, torchlog, urllib.request
        >>> class Next(torch.nn.Module):
        ...     def forward(self, ids):
        ...         return torch.nn.functional.one_hot((ids + 1) % 5, 5).float()
        >>> def loop(model, ids):
        ...     for _ in range(2):
        ...         ids = torch.cat([ids, model(ids)[:, -1:].argmax(-1)], dim=-1)
        ...     return ids
        >>> gen = torchlog.log_generation(Next(), torch.tensor([[1]]), decode=loop)
        >>> server = serve_generation(gen)
        >>> b'torchlog-step-frame' in urllib.request.urlopen(server.url).read()
        True
        >>> server.shutdown(); server.server_close()
    """
    check_generation(gen)
    shell = generation_html(gen, step, site, mode, depth, token_text, served=True)
    server = GenerationServer(gen, shell, mode, depth, port)
    threading.Thread(target=server.serve_forever, name="torchlog-generation-viewer", daemon=True).start()
    return server
