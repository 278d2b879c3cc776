"""`python -m torchlog extract`: a model and a dataset named by factories, in one process or under torchrun.

    torchrun --nproc_per_node=4 -m torchlog extract --model pkg.models:make_model \\
        --data pkg.data:make_dataset --layers transformer.h.3 transformer.h.9 \\
        --batch-size 64 --to acts.h5

Under torchrun (WORLD_SIZE > 1) the command joins the process group (NCCL when CUDA is
available, each rank on `cuda:LOCAL_RANK`; gloo on CPU) before calling extract.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, TorchlogError
from torchlog.datasets.extraction import extract

__all__ = ["main", "build_parser", "run_extract", "load_factory"]


def main(argv: list[str]) -> int:
    """Parse `argv` (what follows `python -m torchlog extract`), run, print; the exit status.

    A TorchlogError is printed as one line on stderr (status 1), without a traceback.
    """
    args = build_parser().parse_args(argv)
    try:
        text = run_extract(args)
    except TorchlogError as exc:
        print(f"torchlog: error: {exc}", file=sys.stderr)
        return 1
    if text:
        print(text)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The arguments of `python -m torchlog extract`."""
    command = argparse.ArgumentParser(
        prog="python -m torchlog extract",
        description="Save chosen layers over a dataset into one array per layer, in one process "
                    "or under torchrun (one shard per rank, joined into --to).")
    command.add_argument("--model", required=True, metavar="MODULE:FACTORY",
                         help="a function returning the nn.Module, e.g. mypkg.models:build")
    command.add_argument("--data", required=True, metavar="MODULE:FACTORY",
                         help="a function returning the inputs: a dataset of samples (with "
                              "--batch-size), a tensor, or an iterable of batches")
    command.add_argument("--layers", required=True, nargs="+",
                         help="labels, module addresses, positions or substrings, as layers_to_save")
    command.add_argument("--to", required=True, help="the HDF5 file to write (or resume)")
    command.add_argument("--batch-size", type=int, default=None, help="samples per batch")
    command.add_argument("--overwrite", action="store_true", help="start over if the file exists")
    command.add_argument("--compression", choices=("gzip", "lzf"), default=None)
    command.add_argument("--chunks", type=int, default=None,
                         help="samples per chunk (default: contiguous when the size is known)")
    command.add_argument("--seed", type=int, default=0, help="seed of batch 0 (batch i: seed + i)")
    command.add_argument("--stop-after", default=None, metavar="SITE",
                         help="end each batch right after this label, module address ('h.3:1') or "
                              "position: the rest of the model does not run")
    command.add_argument("--changed-ops", choices=("error", "by_place"), default="error",
                         help="a batch running other ops than the first before a chosen op: refuse it "
                              "(error, the default) or save each op from its first-batch place (by_place)")
    command.add_argument("--backend", choices=("gloo", "nccl"), default=None,
                         help="torch.distributed backend (default: nccl with CUDA, else gloo)")
    command.add_argument("--no-progress", action="store_true", help="no progress bar")
    return command


def run_extract(args: argparse.Namespace) -> str:
    """Run the command; return what rank 0 prints (other ranks: '').

    Raises:
        InvalidOptionError, InvalidArgumentTypeError: a factory that cannot be imported or
            called, or returns the wrong kind of object; and whatever extract raises.
    """
    joined, device = _join_group(args.backend)
    try:
        model = load_factory(args.model, "--model")()
        if not isinstance(model, nn.Module):
            raise InvalidArgumentTypeError(
                f"--model {args.model!r} returned {type(model).__name__}, not a torch.nn.Module")
        data = load_factory(args.data, "--data")()
        if device is not None:
            model, data = model.to(device), _on_device(data, device, args.batch_size)
        acts = extract(model, data, [_entry(e) for e in args.layers], args.to, args.batch_size,
                       overwrite=args.overwrite, progress=False if args.no_progress else None,
                       compression=args.compression, chunks=args.chunks, random_seed=args.seed,
                       stop_after=None if args.stop_after is None else _entry(args.stop_after),
                       changed_ops=args.changed_ops)
        return f"wrote {acts!r}" if _rank() == 0 else ""
    finally:
        if joined:
            torch.distributed.destroy_process_group()


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def load_factory(spec: str, flag: str) -> Callable[[], Any]:
    """The function `spec` ('package.module:function') names.

    Raises:
        InvalidOptionError: `spec` is malformed, its module does not import, or it names
            nothing callable; the message shows `spec` and why.

    Example:
        >>> load_factory("collections:OrderedDict", "--data")()
        OrderedDict()
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InvalidOptionError(f"{flag} {spec!r} is not MODULE:FUNCTION, e.g. mypkg.data:make_dataset")
    try:
        found: Any = importlib.import_module(module_name)
    except Exception as exc:
        raise InvalidOptionError(
            f"{flag} {spec!r}: module {module_name!r} cannot be imported ({type(exc).__name__}: "
            f"{exc}); it must be importable from the current folder or PYTHONPATH") from exc
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise InvalidOptionError(f"{flag} {spec!r}: module {module_name!r} has no {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise InvalidOptionError(f"{flag} {spec!r} names a {type(found).__name__}, not a function")
    return found


def _entry(text: str) -> str | int:
    """'-5' and '3' are positions; anything else is a label, address or substring."""
    try:
        return int(text)
    except ValueError:
        return text


def _join_group(backend: str | None) -> tuple[bool, torch.device | None]:
    """Join the torchrun process group when there is one and none was joined yet: (whether
    this call joined it, this rank's GPU with NCCL or None)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or torch.distributed.is_initialized():
        return False, None
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        torch.distributed.init_process_group("nccl", device_id=device)
        return True, device
    torch.distributed.init_process_group("gloo")
    return True, None


class _OnDevice(torch.utils.data.Dataset):
    """A dataset whose samples are moved to the rank's GPU as they are read."""

    def __init__(self, data: Any, device: torch.device) -> None:
        self.data, self.device = data, device

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> Any:
        return _moved(self.data[index], self.device)


class _BatchesOnDevice:
    """An iterable of batches (or samples) moved to the rank's GPU as they come."""

    def __init__(self, data: Any, device: torch.device) -> None:
        self.data, self.device = data, device

    def __len__(self) -> int:
        return len(self.data)  # a TypeError, as for the data itself, when it has no length

    def __iter__(self) -> Iterator[Any]:
        return (_moved(item, self.device) for item in self.data)


def _on_device(data: Any, device: torch.device, batch_size: int | None) -> Any:
    if isinstance(data, torch.Tensor) and batch_size is None:
        return data.to(device)  # one batch
    if batch_size is not None and hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        return _OnDevice(data, device)
    return _BatchesOnDevice(data, device)


def _moved(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, (tuple, list)):
        return type(value)(_moved(v, device) for v in value)
    return value
