"""Triton kernel launches recorded as ops: a capture plugin and the source reading it relies on."""
from torchlog.capture.triton.launches import KernelLaunch, log_triton_launches, node_name
from torchlog.capture.triton.source import ArgAccess, read_arg_access

__all__ = ["ArgAccess", "KernelLaunch", "log_triton_launches", "node_name", "read_arg_access"]
