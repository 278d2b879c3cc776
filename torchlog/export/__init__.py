"""Exporters of a finished ModelHistory into other tools: networkx, TensorBoard, ONNX/Netron,
and the module tree printed like `print(model)`.

Each reads only the history (in memory or loaded with `torchlog.load`) and imports its
optional dependency (extras `networkx`, `tensorboard`, `onnx`) when called, so importing
this package loads none of them.
"""
from torchlog.export.costs import ModuleCost, cost_by_module
from torchlog.export.module_tree_text import module_tree
from torchlog.export.netron_server import NetronServer, serve_netron
from torchlog.export.networkx_graph import to_networkx
from torchlog.export.onnx_model import build_model, to_onnx
from torchlog.export.tensorboard_events import to_tensorboard

__all__ = ["cost_by_module", "ModuleCost", "module_tree", "to_networkx", "to_tensorboard",
           "to_onnx", "build_model", "serve_netron", "NetronServer"]
