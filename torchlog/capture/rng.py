"""The RNG states an op may draw from, recorded before it runs and put back to replay it.

A recorded state is the CPU generator's state (a uint8 tensor) or, for an op on a CUDA
device, the tuple `(cpu_state, device_index, cuda_state)`: plain tensors and an int, so
storage writes it without pickling. While no op draws a number, consecutive ops share one
state object instead of each holding a ~5 KB copy.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from torchlog.capture.nesting import find_tensors

__all__ = ["RngState", "cuda_device_of", "rng_restored", "rng_state"]

RngState = torch.Tensor | tuple  # see the module docstring


def rng_state(last: RngState | None, args: tuple = (), kwargs: dict | None = None) -> RngState:
    """The state now for an op called with `args`/`kwargs`; `last` (the previous op's) when
    equal. The CUDA generator of the op's device is read only once CUDA is initialized."""
    cpu = torch.get_rng_state()
    last_cpu = last[0] if type(last) is tuple else last
    if last_cpu is not None and torch.equal(last_cpu, cpu):
        cpu = last_cpu
    device = cuda_device_of(args, kwargs or {})
    if device is None:
        return cpu
    cuda = torch.cuda.get_rng_state(device)
    if type(last) is tuple and last[0] is cpu and last[1] == device and torch.equal(last[2], cuda):
        return last
    return (cpu, device, cuda)


def cuda_device_of(args: tuple, kwargs: dict) -> int | None:
    """Index of the CUDA device an op runs on: its `device=` argument's, else its first CUDA
    tensor's; None for a CPU op, and always while CUDA is not initialized (reading the
    state then would initialize it, and fail before the op on a machine without CUDA)."""
    if not torch.cuda.is_initialized():
        return None
    named = kwargs.get("device")
    if named is not None:
        try:
            device = torch.device(named)
        except (RuntimeError, TypeError, ValueError):  # the op reports its own bad argument
            device = None
        if device is not None and device.type == "cuda":
            return device.index if device.index is not None else torch.cuda.current_device()
    for t, _ in find_tensors((args, kwargs)):
        if t.is_cuda:
            return t.get_device()
    return None


@contextlib.contextmanager
def rng_restored(state: RngState | None) -> Iterator[None]:
    """Run with the generators as `state` recorded them, then put them back as they were.

    The CUDA part is left out on a machine without CUDA, where the op cannot run on CUDA.
    """
    if state is None:
        yield
        return
    cpu, cuda = (state[0], state[1:]) if type(state) is tuple else (state, None)
    before = torch.get_rng_state()
    cuda_before = None
    if cuda is not None and torch.cuda.is_available():
        device, cuda_state = cuda
        cuda_before = torch.cuda.get_rng_state(device)
        torch.cuda.set_rng_state(cuda_state, device)
    torch.set_rng_state(cpu)
    try:
        yield
    finally:
        torch.set_rng_state(before)
        if cuda_before is not None:
            torch.cuda.set_rng_state(cuda_before, device)

