"""The interactive viewer: a self-contained HTML page to explore a logged forward pass.

`to_html` writes the page, `show` returns it for inline display in a notebook,
`serve_page` serves a written page on 127.0.0.1. Graphviz (compiled to WebAssembly,
vendored in `vendor/`) lays the graph out in the browser; nothing loads from the network.
Given a GenerationHistory, `to_html` and `show` give the generation's viewer (one step's
graph with a step control, a site over the steps; `generation_html`), and
`serve_generation` serves one, each step's page built when it is opened.
"""
from torchlog.vis.viewer.annotations import Annotations, Grid
from torchlog.vis.viewer.generation import generation_html
from torchlog.vis.viewer.generation_server import GenerationServer, serve_generation
from torchlog.vis.viewer.page import ViewerPage, default_view, page_html, show, to_html
from torchlog.vis.viewer.serve import PageServer, serve_page

__all__ = ["Annotations", "GenerationServer", "Grid", "PageServer", "ViewerPage", "default_view", "generation_html",
           "page_html", "serve_generation", "serve_page", "show", "to_html"]
