"""Rendering a finished ModelHistory with graphviz (installed as torchlog.vis)."""
