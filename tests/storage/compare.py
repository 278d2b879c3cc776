"""Helpers shared by the storage tests: random tensors of every dtype, and history equality."""
from __future__ import annotations

import dataclasses
import re

import torch

from torchlog.history import ModelHistory, RunInfo
from torchlog.records import PassRecord

ALL_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint16,
    torch.uint32, torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64,
    torch.complex32, torch.complex64, torch.complex128, torch.float8_e4m3fn, torch.float8_e5m2,
    torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.float8_e8m0fnu,
]
# Fields that hold tensors (compared by value) or live code (not stored, see docs/storage.md).
_VALUE_FIELDS = {"saved", "grad_saved", "rng_state"}
_READ_AS = {"saved": "tensor_contents", "grad_saved": "grad_contents"}  # resolve values on disk
_NOT_STORED = {"func_args"}
_PER_RUN = {"elapsed_s", "call_site"}  # differ between two runs of one model


def random_bits(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `dtype` whose bits are random: NaNs, infinities and subnormals included."""
    size = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (*shape, size), dtype=torch.uint8)
    if dtype == torch.bool:
        return raw[..., 0] % 2 == 1
    return raw.view(dtype).reshape(shape)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal dtype, shape and bytes (so NaNs with equal payloads compare equal)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    # Saved values may be views with any strides: compare their bytes in element order.
    return a.numel() == 0 or torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                                          b.contiguous().reshape(-1).view(torch.uint8))


def same_value(a: object, b: object) -> bool:
    """Tensors by bits, containers item by item, everything else with ==."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and same_bits(a, b)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _text(obj: object, same_run: bool) -> str:
    """str(obj), without the timings when comparing two separate runs."""
    text = str(obj)
    return text if same_run else re.sub(r"(Time elapsed|Called from): .*", "", text)


def assert_same_pass(a: PassRecord, b: PassRecord, same_run: bool = True) -> None:
    for f in dataclasses.fields(PassRecord):
        if f.name in _NOT_STORED or (f.name in _PER_RUN and not same_run):
            continue
        if f.name in _VALUE_FIELDS:
            left = getattr(a, _READ_AS.get(f.name, f.name))
            right = getattr(b, _READ_AS.get(f.name, f.name))
            assert same_value(left, right), f"{a.label}.{f.name}: {left!r} != {right!r}"
        else:
            assert getattr(a, f.name) == getattr(b, f.name), (
                f"{a.label}.{f.name}: {getattr(a, f.name)!r} != {getattr(b, f.name)!r}")
    assert _text(a, same_run) == _text(b, same_run)


def assert_same_history(a: ModelHistory, b: ModelHistory, same_run: bool = True) -> None:
    """Everything a user can see of two histories agrees, tensors read from disk included.

    `same_run=False` compares two runs of one model with one seed: timings may differ.
    """
    assert _text(a, same_run) == _text(b, same_run)
    assert repr(a) == repr(b)
    assert a.layer_labels == b.layer_labels
    for f in dataclasses.fields(RunInfo):
        if f.name != "all_passes" and (same_run or f.name != "elapsed_s"):
            assert getattr(a.info, f.name) == getattr(b.info, f.name), f"info.{f.name}"
    for x, y in zip(a, b):
        assert_same_pass(x, y, same_run)
        assert a.lookup_keys(x.label) == b.lookup_keys(y.label), f"lookup keys of {x.label}"
    assert len(a.info.all_passes or []) == len(b.info.all_passes or [])
    assert [(l.label, l.layer_type, [p.label for p in l.passes], l.parent_layers, l.child_layers)
            for l in a.layers] == [(l.label, l.layer_type, [p.label for p in l.passes], l.parent_layers,
                                    l.child_layers) for l in b.layers]
    assert [_text(l, same_run) for l in a.layers] == [_text(l, same_run) for l in b.layers]
    assert {k: dataclasses.asdict(m) for k, m in a.modules.items()} == {
        k: dataclasses.asdict(m) for k, m in b.modules.items()}
    keys = [l.label for l in a.layers] + [k for k in a.modules if k in a]
    for key in keys:  # pass keys are compared in lookup_keys; layers and modules here
        assert key in b and a[key].label == b[key].label, key
