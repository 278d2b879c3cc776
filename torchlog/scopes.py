"""Which call of torch's own Python code an op ran inside, for telling its ops apart."""
from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from torchlog.capture import FUNCTIONAL_KEY

if TYPE_CHECKING:
    from torchlog.capture import RawNode

__all__ = ["internal_scope"]

_TOP = ("",)  # torch code run by a model that is itself a torch module: no user code at all


def internal_scope(node: RawNode) -> Hashable | None:
    """The call of torch's own code whose several ops all carry the site of one instruction.

    An op's call site is an instruction of user code (or of an expanded functional's body).
    When torch code runs below that instruction (a helper such as `_in_projection_packed`
    called from a functional body, or the forward of a torch module such as
    `nn.MultiheadAttention`), all its ops share that one site. Returns the innermost such
    call: the functional call (`'attn.multi_head_attention_forward:1'`), the torch
    module's call (`('attn', 1)`), or the whole pass for a model that is a torch module;
    None for an op called straight from user code, whose site is its own instruction.
    """
    extra = node.extra
    if extra is not None:
        calls = extra.get(FUNCTIONAL_KEY)
        if calls:
            return calls[0]  # innermost first
    site = node.site
    if site is None:
        return None
    op_site, module_sites = site
    if op_site is None:
        return node.module_path[-1] if node.module_path else _TOP
    if module_sites and op_site == module_sites[-1]:
        return node.module_path[-1]  # the site walk ended at the module's own call
    return None
