"""The interactive viewer: a self-contained HTML page to explore a logged forward pass.

`to_html` writes the page, `show` returns it for inline display in a notebook,
`serve_page` serves a written page on 127.0.0.1. Graphviz (compiled to WebAssembly,
vendored in `vendor/`) lays the graph out in the browser; nothing loads from the network.
"""
from torchlog.vis.viewer.annotations import Annotations, Grid
from torchlog.vis.viewer.page import ViewerPage, default_view, page_html, show, to_html
from torchlog.vis.viewer.serve import PageServer, serve_page

__all__ = ["Annotations", "Grid", "PageServer", "ViewerPage", "default_view", "page_html", "serve_page", "show", "to_html"]
