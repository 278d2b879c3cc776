"""Snapshots of global torch state and of a model, to prove that logging leaves both unchanged.

`take(model)` records everything torchlog could disturb; `differences(before, after)` lists,
in words, each thing that changed. Tests assert that list is empty.

Example:
    >>> import torch
    >>> net = torch.nn.Linear(2, 2)
    >>> before = take(net)
    >>> differences(before, take(net))
    []
    >>> handle = net.register_forward_hook(lambda *a: None)
    >>> differences(before, take(net))
    ["model: '' _forward_hooks changed"]
    >>> handle.remove()
"""
from __future__ import annotations

import random
import sys
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as module_globals
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

NAMESPACES = {
    "torch": torch,
    "torch.nn.functional": F,
    "torch.linalg": torch.linalg,
    "torch.fft": torch.fft,
    "torch.special": torch.special,
}
Snapshot = dict[str, Any]


def public_callables(namespace: Any) -> dict[str, Any]:
    """Name -> object of every public callable of a module (the objects, to compare by `is`)."""
    found: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # some attributes are deprecated aliases
        for name in dir(namespace):
            if name.startswith("_"):
                continue
            value = getattr(namespace, name, None)
            if callable(value):
                found[name] = value
    return found


def tensor_class_attributes() -> dict[str, Any]:
    """Every attribute `torch.Tensor` defines or inherits, dunders included, unbound.

    Read from the class dictionaries, not with getattr, which would make a new bound
    object for each classmethod on every read.
    """
    found: dict[str, Any] = {}
    for klass in reversed(torch.Tensor.__mro__):
        found.update(vars(klass))
    return found


def _rng_state() -> tuple:
    np = sys.modules.get("numpy")
    np_state = None
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        np_state = (kind, keys.tobytes(), pos, has_gauss, cached)
    return (random.getstate(), np_state, bytes(torch.random.get_rng_state().numpy()))


def global_state() -> Snapshot:
    """Torch, Python and numpy state that a forward-pass logger could change."""
    state: Snapshot = {f"{name} callables": public_callables(ns) for name, ns in NAMESPACES.items()}
    state["torch.Tensor attributes"] = tensor_class_attributes()
    state["torch-function mode stack"] = list(torch.overrides._get_current_function_mode_stack())
    state["dispatch mode stack"] = list(_get_current_dispatch_mode_stack())
    state["torch function enabled"] = torch._C._is_torch_function_enabled()
    state["grad mode"] = torch.is_grad_enabled()
    state["inference mode"] = torch.is_inference_mode_enabled()
    state["autocast cpu"] = (torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))
    state["default dtype"] = torch.get_default_dtype()
    state["default device"] = torch.get_default_device()
    state["deterministic algorithms"] = (torch.are_deterministic_algorithms_enabled(),
                                         torch.is_deterministic_algorithms_warn_only_enabled())
    state["rng states"] = _rng_state()
    state["global module hooks"] = {
        name: dict(value) for name, value in vars(module_globals).items()
        if name.startswith("_global_") and isinstance(value, dict)
    }
    state["trace and profile functions"] = (sys.gettrace(), sys.getprofile())
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")  # only once torch.compile was used
    state["torch.compile stance"] = repr(getattr(eval_frame, "_stance", None))
    return state


def _hook_dicts(module: nn.Module) -> dict[str, dict]:
    return {name: dict(value) for name, value in vars(module).items()
            if "hook" in name and isinstance(value, dict)}


def model_state(model: nn.Module) -> Snapshot:
    """Parameters, buffers, hooks, flags and attribute names of `model` and its submodules."""
    state: Snapshot = {}
    for address, module in model.named_modules(remove_duplicate=False):
        key = f"model: {address!r}"
        for name, hooks in _hook_dicts(module).items():
            state[f"{key} {name}"] = hooks
        state[f"{key} training"] = module.training
        state[f"{key} attribute names"] = sorted(vars(module))
        state[f"{key} own forward identity"] = vars(module).get("forward")  # set on the instance
        state[f"{key} submodules"] = [(n, id(m)) for n, m in module._modules.items()]
    for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
        for name, tensor in named:
            key = f"model {kind} {name!r}"
            state[f"{key} identity"] = tensor
            state[f"{key} values"] = tensor.detach().clone()
            state[f"{key} requires_grad"] = tensor.requires_grad
            state[f"{key} grad"] = tensor.grad
            state[f"{key} tensor hooks"] = dict(tensor._backward_hooks or {})
            state[f"{key} attribute names"] = sorted(vars(tensor))
    return state


def take(model: nn.Module | None = None) -> Snapshot:
    """Global state, and the state of `model` when given."""
    state = global_state()
    if model is not None:
        state.update(model_state(model))
    return state


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(a[k] is b[k] or _same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(x is y or _same(x, y) for x, y in zip(a, b))
    return a is b or a == b


def _identity_keys(key: str) -> bool:
    return key.endswith(" identity") or key.endswith("callables") or key.endswith("attributes")


def differences(before: Snapshot, after: Snapshot) -> list[str]:
    """Describe every entry that differs between two snapshots; empty when none does."""
    found: list[str] = []
    for key in sorted(before.keys() | after.keys()):
        if key not in before or key not in after:
            found.append(f"{key} {'appeared' if key not in before else 'disappeared'}")
            continue
        a, b = before[key], after[key]
        if _identity_keys(key) and isinstance(a, dict):
            changed = sorted(n for n in a.keys() | b.keys() if a.get(n) is not b.get(n))
            if changed:
                found.append(f"{key} replaced or added: {changed[:10]}")
        elif _identity_keys(key):
            if a is not b:
                found.append(f"{key} replaced")
        elif not _same(a, b):
            found.append(f"{key} changed")
    return found
