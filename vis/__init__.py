"""Rendering a finished ModelHistory with graphviz (installed as torchlog.vis).

`to_dot` builds DOT text with no dependency; `render` runs graphviz's `dot` on it. The
graphviz package is imported only when a file is rendered, never by `import torchlog`.
"""
from torchlog.vis.options import RenderOptions
from torchlog.vis.rendering import GraphFile, options_from_keywords, render, to_dot

__all__ = ["RenderOptions", "GraphFile", "options_from_keywords", "render", "to_dot"]
