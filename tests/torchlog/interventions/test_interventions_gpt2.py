"""Interventions on a transformers GPT-2 (tiny, built from a config, no downloads) against
plain PyTorch: each torchlog edit equals the same edit made by a forward hook or pre-hook on a
plain forward, compared on the logits and on every module's output.
"""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import transformers

import torchlog
from tests.invariants import check_history
from tests.state_snapshot import differences, take
from torchlog import select
from torchlog.interventions import add, patch_from, scale, zero_ablate

pytestmark = pytest.mark.heavy

SEQ, EMBD, HEADS = 8, 32, 4
HEAD_DIM = EMBD // HEADS
KWARGS = {"use_cache": False}
Edit = Callable[[torch.Tensor], torch.Tensor]


@pytest.fixture(scope="module")
def gpt2() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """The model and two prompts of the same length."""
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=EMBD, n_head=HEADS, vocab_size=100,
                                     n_positions=SEQ, bos_token_id=0, eos_token_id=0,
                                     attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval()
    return model, torch.randint(0, 100, (1, SEQ)), torch.randint(0, 100, (1, SEQ))


@pytest.fixture(scope="module")
def clean(gpt2) -> torchlog.ModelHistory:
    model, ids, _ = gpt2
    return torchlog.log_forward_pass(model, ids, input_kwargs=KWARGS)


def _first(out):
    """A module's main output: the tensor, or element 0 of a tuple or ModelOutput."""
    return out if isinstance(out, torch.Tensor) else out[0]


def _with_first(out, edit: Edit):
    """`out` with its main output replaced by `edit(main output)`."""
    if isinstance(out, torch.Tensor):
        return edit(out)
    return (edit(out[0]),) + tuple(out[1:])


def _plain_run(model: torch.nn.Module, ids: torch.Tensor, post: dict[str, Edit] | None = None,
               pre: dict[str, Edit] | None = None) -> dict[str, list[torch.Tensor]]:
    """The oracle: a plain forward with forward hooks editing the outputs of the modules in
    `post` and forward pre-hooks editing the first input of those in `pre`; returns every
    module call's main output (after any edit), by address, and the logits under ''."""
    post, pre = post or {}, pre or {}
    seen: dict[str, list[torch.Tensor]] = {}
    handles = []

    def on_output(module, args, out, address):
        if address in post:
            out = _with_first(out, post[address])
        seen.setdefault(address, []).append(_first(out).detach().clone())
        return out

    def on_input(module, args, address):
        return (pre[address](args[0]),) + tuple(args[1:])

    for address, module in model.named_modules():
        if address:
            handles.append(module.register_forward_hook(
                lambda m, a, o, address=address: on_output(m, a, o, address)))
        if address in pre:
            handles.append(module.register_forward_pre_hook(lambda m, a, address=address: on_input(m, a, address)))
    try:
        with torch.no_grad():
            seen[""] = [model(ids, **KWARGS).logits]
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _logged_outputs(history: torchlog.ModelHistory) -> dict[str, list[torch.Tensor]]:
    """Every module call's main output in a history, as `_plain_run` returns them."""
    found = {address: [history[labels[0]].tensor_contents for labels in record.call_outputs]
             for address, record in history.modules.items() if record.call_outputs}
    found[""] = [history[history.output_layers[0]].tensor_contents]
    return found


def _assert_same_outputs(history: torchlog.ModelHistory, oracle: dict[str, list[torch.Tensor]]) -> None:
    got = _logged_outputs(history)
    assert got.keys() == oracle.keys()
    for address, values in oracle.items():
        assert len(got[address]) == len(values), address
        for mine, want in zip(got[address], values):
            # Same kernels on the same values: bit-exact, not merely close.
            torch.testing.assert_close(mine, want, rtol=0, atol=0, msg=lambda m: f"{address}: {m}")


def test_steering_block_2_with_add_equals_a_forward_hook_adding_the_vector(gpt2, clean) -> None:
    model, ids, _ = gpt2
    vector = torch.linspace(-1.0, 1.0, EMBD)
    before = take(model)
    history = torchlog.log_forward_pass(model, ids, input_kwargs=KWARGS,
                                        intervene={"transformer.h.2": add(vector)})
    assert differences(before, take(model)) == []
    check_history(history)
    oracle = _plain_run(model, ids, post={"transformer.h.2": lambda t: t + vector})
    _assert_same_outputs(history, oracle)
    (record,) = history.interventions
    assert record.site == "transformer.h.2" and record.label == history["transformer.h.2"].label
    assert record.max_abs_change == pytest.approx(1.0, rel=1e-6)
    # The edit reached the logits: they differ from the clean run's.
    clean_logits = clean[clean.output_layers[0]].tensor_contents
    assert not torch.allclose(oracle[""][0], clean_logits, rtol=0, atol=1e-3)


def _merged_heads_site(clean: torchlog.ModelHistory, block: int) -> tuple[select.Selector, str]:
    """A selector for the op of `block`'s attention that merges the heads, (batch, seq, embd),
    right before c_proj: the parent from outside c_proj of c_proj's first op. Found in a
    logged pass, so it holds whatever op this transformers version merges heads with."""
    attn = f"transformer.h.{block}.attn"
    c_proj = clean.modules[f"{attn}.c_proj"]
    first_inside = clean[c_proj.call_layers[0][0]]
    inside = set(c_proj.call_layers[0])
    (merged,) = [clean[p] for p in first_inside.parent_labels if p not in inside]
    assert tuple(merged.tensor_contents.shape) == (1, SEQ, EMBD), merged
    site = select.func(merged.func_name) & select.in_module(attn)
    # The selector names that pass alone, or the intervention would act elsewhere too.
    assert site.passes_in(clean) == {merged.op_index}, (site, merged.label)
    return site, merged.label


def test_zeroing_one_head_before_c_proj_equals_a_pre_hook_on_c_proj(gpt2, clean) -> None:
    model, ids, _ = gpt2
    head = 2
    part = (..., slice(head * HEAD_DIM, (head + 1) * HEAD_DIM))
    site, label = _merged_heads_site(clean, block=1)
    history = torchlog.log_forward_pass(model, ids, input_kwargs=KWARGS,
                                        intervene={site: zero_ablate(index=part)})
    check_history(history)

    def zero_head(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[part] = 0.0
        return t

    oracle = _plain_run(model, ids, pre={"transformer.h.1.attn.c_proj": zero_head})
    _assert_same_outputs(history, oracle)
    (record,) = history.interventions
    assert record.label == label and record.site == site
    merged = clean[label].tensor_contents.detach()
    assert record.max_abs_change == pytest.approx(float(merged[part].abs().max()), rel=1e-6)
    edited = history[label].tensor_contents
    assert torch.equal(edited[part], torch.zeros_like(edited[part]))
    other_heads = torch.ones(EMBD, dtype=torch.bool)
    other_heads[part[1]] = False
    assert torch.equal(edited[..., other_heads], merged[..., other_heads])


def test_patching_block_1_from_another_prompt_equals_a_hook_replacing_its_output(gpt2) -> None:
    model, ids, other_ids = gpt2
    source = torchlog.log_forward_pass(model, other_ids, input_kwargs=KWARGS)
    source_output = _plain_run(model, other_ids)["transformer.h.1"][0]
    history = torchlog.log_forward_pass(model, ids, input_kwargs=KWARGS,
                                        intervene={"transformer.h.1": patch_from(source)})
    check_history(history)
    oracle = _plain_run(model, ids, post={"transformer.h.1": lambda t: source_output.clone()})
    _assert_same_outputs(history, oracle)
    assert [r.label for r in history.interventions] == [history["transformer.h.1"].label]
    # Everything after block 1 depends on the prompt only through its output (no cache, one
    # position embedding table): the logits are the other prompt's.
    torch.testing.assert_close(oracle[""][0], source[source.output_layers[0]].tensor_contents, rtol=0, atol=0)


def test_patching_the_last_position_only_changes_that_position_downstream(gpt2) -> None:
    model, ids, other_ids = gpt2
    source = torchlog.log_forward_pass(model, other_ids, input_kwargs=KWARGS)
    source_output = _plain_run(model, other_ids)["transformer.h.1"][0]
    history = torchlog.log_forward_pass(model, ids, input_kwargs=KWARGS,
                                        intervene={"transformer.h.1": patch_from(source, index=(slice(None), -1))})

    def patch_last(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[:, -1] = source_output[:, -1]
        return t

    _assert_same_outputs(history, _plain_run(model, ids, post={"transformer.h.1": patch_last}))
    clean_logits = _plain_run(model, ids)[""][0]
    logits = history[history.output_layers[0]].tensor_contents
    assert torch.equal(logits[:, :-1], clean_logits[:, :-1])  # causal: earlier positions untouched
    assert not torch.allclose(logits[:, -1], clean_logits[:, -1], rtol=0, atol=1e-4)


@pytest.mark.parametrize("stop", ["transformer.h.1", "transformer.h.1:1"])
def test_stop_after_block_1_runs_nothing_after_it_in_the_returned_pass(gpt2, clean, stop) -> None:
    model, ids, _ = gpt2
    later_calls = []
    untouched = take(model)
    handles = [model.transformer.h[2].register_forward_pre_hook(lambda m, a: later_calls.append("h.2")),
               model.transformer.ln_f.register_forward_pre_hook(lambda m, a: later_calls.append("ln_f")),
               model.lm_head.register_forward_pre_hook(lambda m, a: later_calls.append("lm_head"))]
    try:
        before = take(model)
        history = torchlog.log_forward_pass(model, ids, input_kwargs=KWARGS, stop_after=stop)
        after = take(model)
    finally:
        for handle in handles:
            handle.remove()
    block_1_output = clean["transformer.h.1"].label
    assert history.stopped_at == block_1_output
    assert history.layer_labels[-1] == block_1_output
    assert history.layer_labels == clean.layer_labels[:clean.layer_labels.index(block_1_output) + 1]
    assert not history.is_partial and history.output_layers == []
    # A module call (the first, without a call number) is decided while the pass runs: one
    # pass, which stops there.
    assert later_calls == [], f"modules after the stop ran: {later_calls}"
    assert differences(before, after) == []  # the counting hooks still in place, nothing else
    assert differences(untouched, take(model)) == []
    assert torch.equal(history[block_1_output].tensor_contents, _plain_run(model, ids)["transformer.h.1"][0])


def test_a_label_site_the_first_softmax_equals_the_same_edit_by_a_pre_hook_on_c_proj(gpt2, clean) -> None:
    model, ids, _ = gpt2
    softmaxes = [p for p in clean.passes if p.func_name == "softmax"]
    assert len(softmaxes) == 3  # one per block
    label = softmaxes[0].label
    assert any(m.startswith("transformer.h.0.attn:") for m in softmaxes[0].containing_modules), label
    # Halve head 1's attention pattern, by the softmax's label (found in a logged pass first).
    history = torchlog.log_forward_pass(model, ids, input_kwargs=KWARGS,
                                        intervene={label: scale(0.5, index=(slice(None), 1))})
    check_history(history)
    assert [(r.site, r.label) for r in history.interventions] == [(label, label)]
    pattern = clean[label].tensor_contents.detach()
    halved = pattern.clone()
    halved[:, 1] *= 0.5
    assert torch.equal(history[label].tensor_contents, halved)
    # The softmax has no module boundary of its own (transformers 5 calls dropout as a
    # function), so the oracle edits the next place a hook reaches: head 1's output, which
    # is pattern @ values, so it halves too; halving is exact in floating point, and the
    # result is bit-exact.
    heads = slice(HEAD_DIM, 2 * HEAD_DIM)

    def halve_head(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[..., heads] *= 0.5
        return t

    oracle = _plain_run(model, ids, pre={"transformer.h.0.attn.c_proj": halve_head})
    _assert_same_outputs(history, oracle)
