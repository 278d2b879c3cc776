"""A `layers_to_save` list served from a kept probe: the lean capture copies the chosen values, the probe gives the rest.

Once a model has a probe kept for an input signature (sites/probes.py), everything a
history says besides its values is known before the pass: labels, parents, modules, loops.
A call that saves a list of op passes, and asks for nothing the lean capture cannot give
(no interventions, stop, gradients, post-function, device, profile, function arguments or
file), then runs the model under the lean capture (capture/lean.py), which copies only the
chosen calls' outputs, and builds the history from the probe's records with those values.
The lean pass must make exactly the probe's calls, all of them; otherwise the caller runs
the full capture. Per-op times and call sites are those the probe recorded.
"""
from __future__ import annotations

import dataclasses
from time import perf_counter
from typing import Any

import torch

from torchlog.arguments import Request
from torchlog.errors import InvalidOptionError
from torchlog.capture import call_names, run_lean
from torchlog.history import ModelHistory, RunInfo, all_passes
from torchlog.model_state import eager_submodules, model_kept
from torchlog.records import LayerRecord, NodeKind
from torchlog.seeding import seeded
from torchlog.sites.planner import reached
from torchlog.sites.resolve import call_positions, resolve

__all__ = ["can_serve", "metadata_of", "served_history"]

_OPS = (NodeKind.OP, NodeKind.CREATED)


def can_serve(request: Request) -> bool:
    """Whether the request asks only for what a served history gives: a list of values
    saved without their autograd graph (grad mode off, or detach_saved_tensors)."""
    options, capture = request.options, request.capture
    planner = request.acting
    return (planner is not None and planner.entries is not None and not planner.sites
            and planner.stop_after is None and capture.sink is None and capture.postfunc is None
            and capture.output_device is None and not capture.profile and not capture.save_function_args
            and not options.save_gradients
            and (options.detach_saved_tensors or not torch.is_grad_enabled()))


def served_history(request: Request, probe: ModelHistory, started: float) -> ModelHistory | None:
    """The history of one lean pass with the chosen values, the rest from `probe`; None when
    a chosen pass is not an op's output or the pass made other calls than the probe (the
    caller then logs the pass in full)."""
    passes = all_passes(probe)
    entries = request.acting.entries
    try:
        chosen = sorted(reached(probe, entries) if probe.is_partial else resolve(probe, entries))
    except InvalidOptionError:
        return None  # names nothing in the kept probe: the full pass says whether it names anything
    positions = call_positions(passes)
    if probe.is_partial or any(passes[i].kind not in _OPS or i not in positions for i in chosen):
        return None
    wanted: dict[int, tuple[int, ...]] = {}
    for index in chosen:
        call, output = positions[index]
        wanted[call] = wanted.get(call, ()) + (output,)
    with seeded(request.seed, numpy=request.options.random_seed is not None), \
            model_kept(request.named_modules), eager_submodules(request.named_modules):
        seen = run_lean(request.model, request.args, request.kwargs, wanted, named_modules=request.named_modules)
    expected = [passes[i].func_name for i, (_, output) in sorted(positions.items()) if output == 0]
    if [c for c in call_names(seen.calls) if not isinstance(c, int)] != expected:
        return None
    copies = {i: dataclasses.replace(passes[i], saved=seen.saved[positions[i]]) for i in chosen}
    everything = [copies.get(p.op_index, p) for p in passes]
    layers = [_layer_with(layer, copies) for layer in probe.layers]
    info = RunInfo(model_name=probe.info.model_name, random_seed=request.seed,
                   elapsed_s=perf_counter() - started, num_modules=probe.info.num_modules,
                   all_passes=everything)
    kept = everything if request.options.keep_unsaved_layers else [copies[i] for i in chosen]
    return ModelHistory(kept, layers, dict(probe.modules), info)


def _layer_with(layer: LayerRecord, copies: dict[int, Any]) -> LayerRecord:
    """`layer`, or a copy naming the copies of its passes."""
    if not any(p.op_index in copies for p in layer.passes):
        return layer
    return LayerRecord(layer.label, layer.layer_type, tuple(copies.get(p.op_index, p) for p in layer.passes))


def metadata_of(history: ModelHistory) -> ModelHistory:
    """A copy of the history of a whole pass (every pass held) holding no values, to keep
    as its model's probe: the kept probe must not keep the user's activations alive."""
    passes = all_passes(history)
    copies = {p.op_index: dataclasses.replace(p, saved=None, grad_saved=None) for p in passes}
    everything = [copies[p.op_index] for p in passes]
    info = dataclasses.replace(history.info, all_passes=everything, interventions=())
    return ModelHistory(everything, [_layer_with(layer, copies) for layer in history.layers],
                        dict(history.modules), info)
