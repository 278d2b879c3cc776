"""vis/viewer/plumbing.py: ops outside every module grouped into helper runs and folds."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlog
from torchlog.vis.viewer.data import page_data, scope_table
from torchlog.vis.viewer.page import count_nodes, page_node_count


def _causal_mask(n: int) -> torch.Tensor:
    """A helper outside every module, as transformers' masking code is."""
    steps = torch.arange(n)
    return steps[:, None] >= steps[None, :]


class Masked(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = _causal_mask(x.shape[0])
        positions = torch.arange(x.shape[0]).unsqueeze(1)  # a chain of index ops in forward
        scores = self.fc(x) + positions
        return scores.masked_fill(~mask, 0.0) * 2


def _history() -> torchlog.ModelHistory:
    return torchlog.log_forward_pass(Masked(), torch.randn(4, 4), random_seed=0)


def test_helper_ops_and_index_chains_get_scopes_of_their_own():
    history = _history()
    scopes, plumbing = scope_table(history)
    helper_ops = [r.label for r in history if "_causal_mask" in (r.call_site or "")]
    chain = [r.label for r in history if r.func_name in ("arange", "unsqueeze")
             and "in forward" in (r.call_site or "")]
    assert len(helper_ops) == 4 and len(chain) == 2
    by_kind = {s.kind: s for s in plumbing.values()}
    assert set(by_kind) == {"helper", "fold"}
    helper, fold = by_kind["helper"], by_kind["fold"]
    assert helper.key == "test_viewer_plumbing:1" and list(helper.members) == helper_ops
    assert helper.title == "test_viewer_plumbing (helper): _causal_mask"
    assert list(fold.members) == chain and fold.title == "2 index ops (arange, unsqueeze)"
    assert all(scopes[label] == (helper.key,) for label in helper_ops)
    # The model's own arithmetic stays where it is: the add, the masked fill, the product.
    own = [r for r in history if r.func_name in ("add", "masked_fill", "mul")]
    assert len(own) == 3 and all(scopes[r.label] == () for r in own)


def test_page_data_describes_plumbing_like_a_call():
    history = _history()
    data = page_data(history, "unrolled", None, with_stats=False)
    helper = data["calls"]["test_viewer_plumbing:1"]
    assert (helper["kind"], helper["address"], helper["call"], helper["depth"]) == \
        ("helper", "test_viewer_plumbing", 1, 1)
    assert helper["lines"][0] == "test_viewer_plumbing (helper): _causal_mask"
    assert helper["outputs"] == [[4, 4]]  # the mask, read by the model's own ops
    assert data["calls"]["fc:1"]["kind"] == "module"
    assert data["modules"]["index ops #1"]["kind"] == "fold"


def test_folded_plumbing_draws_one_node_per_scope():
    history = _history()
    _, plumbing = scope_table(history)
    folded = sum(len(s.members) - 1 for s in plumbing.values())
    for depth in (1, None):
        assert page_node_count(history, "unrolled", depth) == count_nodes(history, "unrolled", depth) - folded


@pytest.mark.heavy
def test_plumbing_folds_inside_modules_by_what_it_does():
    """GPT2LMHeadModel builds its mask and positions inside `transformer`: they fold there;
    the attention's own views and transposes (they carry the activations) do not."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100, n_positions=32,
                        bos_token_id=99, eos_token_id=99, attn_implementation="eager")
    history = torchlog.log_forward_pass(GPT2LMHeadModel(config).eval(), torch.randint(0, 100, (1, 12)),
                                        random_seed=0)
    scopes, plumbing = scope_table(history)
    mask_ops = [r.label for r in history if "masking_utils" in (r.call_site or "")]
    assert len(mask_ops) >= 5
    helpers = {scopes[label][0] for label in mask_ops}
    assert len(helpers) == 1 and plumbing[helpers.pop()].kind == "helper"
    assert all(scopes[label][1:] == ("transformer:1",) for label in mask_ops)
    positions = [r.label for r in history if r.func_name == "arange" and "masking_utils" not in (r.call_site or "")]
    assert positions and all(plumbing[scopes[label][0]].kind == "fold" for label in positions)
    moved = [r for r in history if r.func_name in ("view", "transpose", "permute", "split")
             and any(c.startswith("transformer.h.0.attn") for c in r.containing_modules)]
    assert moved and not any(scopes[r.label][0] in plumbing for r in moved)
    # At depth 2 the scopes inside `transformer` are drawn, each as one node.
    drawn = [s for s in plumbing.values() if len(scopes[s.members[0]]) - 1 < 2]
    assert len(drawn) >= 2
    folded = sum(len(s.members) - 1 for s in drawn)
    assert page_node_count(history, "unrolled", 2) == count_nodes(history, "unrolled", 2) - folded
