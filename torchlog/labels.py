"""Formatting and parsing of layer labels: `conv2d_3_7` and `conv2d_3_7:2`."""
from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["ParsedLabel", "layer_type_of", "layer_label", "pass_label", "split_pass", "parse_label"]

_PASS_SEP = ":"
_LABEL_RE = re.compile(r"^(?P<type>[A-Za-z0-9_]+?)_(?P<type_num>\d+)(?:_(?P<total>\d+))?(?::(?P<pass>\d+))?$")


class ParsedLabel(NamedTuple):
    """The parts of a label; `total_num` and `pass_num` are None when absent."""

    layer_type: str
    type_num: int
    total_num: int | None
    pass_num: int | None


def layer_type_of(func_name: str) -> str:
    """Map a function name to its layer type: `max_pool2d` -> `maxpool2d`, `__add__` -> `add`.

    In-place methods keep their base name (`relu_` -> `relu`); records carry an
    `is_inplace` flag instead. Triton kernels keep their name: `triton_act_quant`.
    """
    if func_name.startswith("triton_"):
        return func_name.lower()
    return func_name.strip("_").replace("_", "").lower() or "op"


def layer_label(layer_type: str, type_num: int, total_num: int) -> str:
    """Return the label of a layer, e.g. `conv2d_3_7`."""
    return f"{layer_type}_{type_num}_{total_num}"


def pass_label(layer: str, pass_num: int, num_passes: int) -> str:
    """Return the label of one pass: the layer label, with `:k` only when it ran more than once."""
    return f"{layer}{_PASS_SEP}{pass_num}" if num_passes > 1 else layer


def split_pass(key: str) -> tuple[str, int | None]:
    """Split `name:3` into (`name`, 3); a key without a pass gives (`key`, None).

    Raises:
        ValueError: the part after the colon is not a positive integer.
    """
    base, sep, tail = key.rpartition(_PASS_SEP)
    if not sep:
        return key, None
    if not tail.isdigit() or int(tail) < 1:
        raise ValueError(f"pass number in {key!r} must be a positive integer, got {tail!r}")
    return base, int(tail)


def parse_label(key: str) -> ParsedLabel | None:
    """Parse a full (`conv2d_3_7:1`) or short (`conv2d_3`) label; None if `key` is not one."""
    match = _LABEL_RE.match(key)
    if match is None:
        return None
    total, pass_num = match["total"], match["pass"]
    return ParsedLabel(
        match["type"],
        int(match["type_num"]),
        None if total is None else int(total),
        None if pass_num is None else int(pass_num),
    )
