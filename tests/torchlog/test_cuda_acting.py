"""Interventions, patching sweeps and compare on a model that lives on a CUDA GPU, each against
plain PyTorch on the same GPU: a forward hook making the same edit, and a hand-written loop of
patched forwards. Skipped with a reason where torch.cuda.is_available() is False.
"""
from __future__ import annotations

import pytest
import torch
import transformers

import torchlog
from torchlog import select
from torchlog.interventions import patch_from, scale, zero_ablate
from torchlog.patching import sweep

pytestmark = [pytest.mark.cuda, pytest.mark.heavy,
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="needs a CUDA GPU: torch.cuda.is_available() is False here")]

SEQ = 8
KWARGS = {"use_cache": False}


@pytest.fixture(scope="module")
def gpt2() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=100, n_positions=SEQ,
                                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = transformers.GPT2LMHeadModel(config).eval().cuda()
    clean = torch.randint(0, 100, (1, SEQ), device="cuda")
    corrupted = clean.clone()
    corrupted[0, 2] = (clean[0, 2] + 1) % 100
    return model, clean, corrupted


def _hooked_logits(model, ids, address, edit) -> torch.Tensor:
    def hook(module, args, out):
        return (edit(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else edit(out)

    handle = model.get_submodule(address).register_forward_hook(hook)
    try:
        with torch.no_grad():
            return model(ids, **KWARGS).logits
    finally:
        handle.remove()


def _logits(history: torchlog.ModelHistory) -> torch.Tensor:
    return history[history.output_layers[0]].saved


def test_an_ablation_on_the_gpu_equals_a_hook_and_stays_on_the_gpu(gpt2) -> None:
    model, clean, _ = gpt2
    history = torchlog.log_forward_pass(model, clean, input_kwargs=KWARGS,
                                        intervene={"transformer.h.1.mlp": zero_ablate()})
    oracle = _hooked_logits(model, clean, "transformer.h.1.mlp", torch.zeros_like)
    logits = _logits(history)
    assert logits.device.type == "cuda"
    torch.testing.assert_close(logits, oracle, rtol=1e-5, atol=1e-5)
    assert [r.site for r in history.interventions] == ["transformer.h.1.mlp"]


def test_patching_a_clean_value_into_a_corrupted_gpu_run_equals_a_hook(gpt2) -> None:
    model, clean, corrupted = gpt2
    source = torchlog.log_forward_pass(model, clean, input_kwargs=KWARGS)
    history = torchlog.log_forward_pass(model, corrupted, input_kwargs=KWARGS,
                                        intervene={"transformer.h.0": patch_from(source)})
    value = source["transformer.h.0"].saved
    oracle = _hooked_logits(model, corrupted, "transformer.h.0", lambda v: value.to(v.device))
    torch.testing.assert_close(_logits(history), oracle, rtol=1e-5, atol=1e-5)


def test_an_op_site_inside_a_module_on_the_gpu_equals_an_edit_of_the_op(gpt2) -> None:
    model, clean, _ = gpt2
    history = torchlog.log_forward_pass(model, clean, input_kwargs=KWARGS,
                                        intervene={select.func("softmax") & select.in_module("transformer.h.2"): scale(0.5)})
    # The oracle: attention weights enter the block only through weights @ values, which
    # c_proj then reads, so halving the softmax halves c_proj's input.
    handle = model.get_submodule("transformer.h.2.attn.c_proj").register_forward_pre_hook(
        lambda module, args: (args[0] * 0.5,) + tuple(args[1:]))
    try:
        with torch.no_grad():
            oracle = model(clean, **KWARGS).logits
    finally:
        handle.remove()
    torch.testing.assert_close(_logits(history), oracle, rtol=1e-5, atol=1e-5)


def _metric(out) -> torch.Tensor:
    return out.logits[0, -1, 5] - out.logits[0, -1, 7]


def _main(out) -> torch.Tensor:
    """A block's hidden states: the output itself, or element 0 of the tuple older transformers return."""
    return out[0] if isinstance(out, tuple) else out


def _hook_loop(model, clean, corrupted) -> list[float]:
    blocks = list(model.transformer.h)
    values: list[torch.Tensor] = []
    handles = [b.register_forward_hook(lambda m, a, out: values.append(_main(out).detach().clone())) for b in blocks]
    try:
        with torch.no_grad():
            model(clean, **KWARGS)
    finally:
        for handle in handles:
            handle.remove()
    found = []
    for block, value in zip(blocks, values):
        for position in range(SEQ):
            def patch(module, args, out, value=value, position=position):
                new = _main(out).clone()
                new[:, position] = value[:, position]
                return (new, *out[1:]) if isinstance(out, tuple) else new

            handle = block.register_forward_hook(patch)
            try:
                with torch.no_grad():
                    found.append(float(_metric(model(corrupted, **KWARGS))))
            finally:
                handle.remove()
    return found


@pytest.mark.parametrize("batch_size", [None, 8])
def test_a_gpu_sweep_equals_a_loop_of_hooked_forwards(gpt2, batch_size) -> None:
    model, clean, corrupted = gpt2
    with torch.no_grad():
        result = sweep(model, clean, corrupted, select.module_type("GPT2Block"), _metric,
                       positions=range(SEQ), input_kwargs=KWARGS, batch_size=batch_size, progress=False)
    oracle = _hook_loop(model, clean, corrupted)
    assert len(result) == len(oracle)
    torch.testing.assert_close(torch.tensor([r.metric for r in result]), torch.tensor(oracle),
                               rtol=1e-4, atol=1e-5)


def test_compare_of_a_gpu_run_in_fp32_and_bf16_finds_no_shape_or_pairing_gaps(gpt2) -> None:
    model, clean, _ = gpt2
    a = torchlog.log_forward_pass(model, clean, input_kwargs=KWARGS)
    low = transformers.GPT2LMHeadModel(model.config).eval().cuda()
    low.load_state_dict(model.state_dict())
    low = low.to(torch.bfloat16)
    b = torchlog.log_forward_pass(low, clean, input_kwargs=KWARGS, save_function_args=True)
    comparison = torchlog.compare(a, b)
    statuses = {row.status for row in comparison.rows}
    assert "shape" not in statuses and "only_a" not in statuses and "only_b" not in statuses
    # bf16 against fp32 under bf16's default tolerance: the logits agree to about 1e-2 relative.
    (logits,) = [row for row in comparison.rows if row.label_a == a.output_layers[0]]
    assert logits.status in ("match", "differs") and logits.diff.rel_l2 < 5e-2
