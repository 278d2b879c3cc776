"""Each hard case of capture in tests/models.py, checked in detail against independent values."""
from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import torchlog
from tests.invariants import ancestors, check_history
from tests.models import (
    TINY_MODELS,
    Branching,
    Conditional,
    CreatedInside,
    DoubleUse,
    GetSetItem,
    IdentityModules,
    InPlace,
    MetadataCalls,
    ModuleOutputs,
    MultiOutput,
    Nested,
    NoGradInside,
    Orphans,
    ReusedModule,
    StructuredIO,
    TrainEval,
    WithBuffers,
)


def _log(model: torch.nn.Module, *args, **options) -> torchlog.ModelHistory:
    history = torchlog.log_forward_pass(model, list(args), **options)
    pruned = isinstance(options.get("layers_to_save"), list)
    check_history(history, postfunc_used="activation_postfunc" in options, complete=not pruned)
    return history


def _by_func(history: torchlog.ModelHistory, func_name: str) -> list:
    return [p for p in history if p.func_name == func_name]


@pytest.mark.parametrize("save", ["all", "none", "some"])
@pytest.mark.parametrize("name", sorted(TINY_MODELS))
def test_invariants_hold(name: str, save: str) -> None:
    cls, make_input = TINY_MODELS[name]
    torch.manual_seed(0)
    model, x = cls(), make_input()
    layers_to_save = {"all": "all", "none": None, "some": [1, -2]}[save]
    history = _log(model, x, layers_to_save=layers_to_save, random_seed=0)
    if save == "some":  # exactly the chosen passes, and the lists name only them
        full = _log(model, x, random_seed=0)
        chosen = dict.fromkeys([full[1].label, full[-2].label])
        assert history.layer_labels == [p.label for p in full if p.label in chosen]
        assert history.output_layers == [label for label in full.output_layers if label in chosen]
    assert history.num_saved == (0 if save == "none" else len(history))


def test_invariants_hold_with_postfunc_and_extra_models() -> None:
    for model, x in ((ModuleOutputs(), torch.randn(2, 3)), (MetadataCalls(), torch.randn(2, 3))):
        _log(model, x)
        history = _log(model, x, activation_postfunc=lambda t: t.float().mean())
        assert all(p.tensor_contents.shape == () for p in history)


def test_branching_and_merging() -> None:
    torch.manual_seed(0)
    model, x = Branching(), torch.rand(2, 4)
    history = _log(model, x)
    (inp,) = history.input_layers
    assert [history[c].func_name for c in history[inp].children] == ["linear", "linear", "repeat"]
    (cat,) = _by_func(history, "cat")
    assert [(history[e.label].func_name, e.arg) for e in cat.parents] == [("relu", (0, 0)), ("sigmoid", (0, 1))]
    assert history.has_branching
    expected = torch.cat([torch.relu(model.left(x)), torch.sigmoid(model.right(x))], 1) - x.repeat(1, 2)
    assert torch.equal(history[history.output_layers[0]].tensor_contents, expected.detach())


def test_inplace_ops_save_the_value_at_their_time() -> None:
    x = torch.randn(3, 4)
    history = _log(InPlace(), x)
    ops = [p for p in history if not (p.is_input or p.is_output)]
    assert [p.func_name for p in ops] == ["mul", "relu_", "add_", "sin", "mul_", "add"]
    assert [p.is_inplace for p in ops] == [False, True, True, False, True, False]
    doubled = x * 2
    relued = torch.relu(doubled)
    plus_one = relued + 1
    expected = [doubled, relued, plus_one, torch.sin(plus_one), plus_one * 3, plus_one * 3 + torch.sin(plus_one)]
    for record, value in zip(ops, expected):
        assert torch.equal(record.tensor_contents, value), f"{record.label} was changed by a later in-place op"
    # each in-place op's parent is the previous writer of the tensor
    assert [ops[i].parent_labels for i in (1, 2, 4)] == [(ops[0].label,), (ops[1].label,), (ops[2].label,)]


def test_getitem_setitem_values_and_links() -> None:
    x = torch.randn(3, 4)
    history = _log(GetSetItem(), x)
    (setitem,) = _by_func(history, "__setitem__")
    assert setitem.is_inplace
    assert [(history[e.label].func_name, e.arg) for e in setitem.parents] == [("clone", 0), ("mul", 2)]
    (clone,) = _by_func(history, "clone")
    assert torch.equal(clone.tensor_contents, x), "clone was saved after the later setitem"
    first = _by_func(history, "__getitem__")[0]
    assert torch.equal(first.tensor_contents, x[0])
    expected = x.clone()
    expected[1] = x[0] * 10
    assert torch.equal(setitem.tensor_contents, expected)


def test_mutation_through_a_view_is_a_dependency() -> None:
    """`row = y[:, 0]; row.add_(5)` changes `y` and `first = y[0]`; the sums read afterwards
    consumed the mutated values, so the add_ must be among their ancestors and each sum must
    equal the sum of what its parents saved."""
    x = torch.randn(3, 4)
    history = _log(GetSetItem(), x)
    # The write gets one node for the view it wrote, and one more output per other view
    # read afterwards (`y`, `first`), each holding that view's value after the write.
    (add_,) = [p for p in _by_func(history, "add_") if "view_written_by" not in p.extra]
    row_sum, first_sum = _by_func(history, "sum")
    for record, dims in ((row_sum, 1), (first_sum, None)):
        assert add_.label in ancestors(history, [record.label]), (
            f"{record.label} read a tensor that {add_.label} had changed through a view")
        (parent,) = record.parent_labels
        consumed = history[parent].tensor_contents
        recomputed = consumed.sum(dim=dims) if dims is not None else consumed.sum()
        assert torch.equal(record.tensor_contents, recomputed), (
            f"{record.label} is not the sum of its parent {parent}'s saved value")


def test_tensors_created_inside_forward() -> None:
    torch.manual_seed(0)
    x = torch.randn(2, 4)
    history = _log(CreatedInside(), x, random_seed=1)
    created = {p.func_name for p in history if p.is_created}
    assert created == {"ones", "arange", "tensor", "randn"}
    sources = [p for p in history if p.is_source]
    assert len(sources) == 2, "from_numpy and torch.Tensor([...]) are source nodes"
    for record in sources:
        assert not record.parents and record.children
        assert torch.equal(record.tensor_contents, torch.ones(4))
    for record in history:
        if record.is_created or record.is_source:
            assert not record.parents and not (record.is_input or record.is_buffer)
    torch.manual_seed(1)
    assert torch.equal(_by_func(history, "randn")[0].tensor_contents, torch.randn(x.shape))


def test_from_numpy_input_mutated_by_numpy_later_keeps_its_value() -> None:
    class FromNumpy(torch.nn.Module):
        def forward(self, x):
            array = np.arange(4, dtype=np.float32)
            t = torch.from_numpy(array)
            y = x + t
            array += 100  # changes t's storage behind torch's back
            return y * t

    x = torch.zeros(4)
    history = _log(FromNumpy(), x)
    (source,) = [p for p in history if p.is_source]
    assert torch.equal(source.tensor_contents, torch.arange(4.0))
    assert torch.equal(history[history.output_layers[0]].tensor_contents, torch.arange(4.0) * (torch.arange(4.0) + 100))


def test_buffers_read_and_reassigned() -> None:
    torch.manual_seed(0)
    model, x = WithBuffers(), torch.randn(2, 4)
    history = _log(model, x)
    buffers = {p.buffer_address: p for p in history if p.is_buffer}
    assert set(buffers) == {"calls", "scale"}
    assert torch.equal(buffers["scale"].tensor_contents, torch.full((4,), 3.0))
    assert torch.equal(buffers["calls"].tensor_contents, torch.zeros(()))
    assert all(not p.parents for p in buffers.values())
    (out,) = history.output_layers
    assert torch.equal(history[out].tensor_contents, (model.lin(x) * 3 + 1).detach())


def test_identity_modules_and_returned_inputs() -> None:
    torch.manual_seed(0)
    model, x = IdentityModules(), torch.randn(2, 3)
    history = _log(model, x)
    (inp,) = history.input_layers
    (linear,) = _by_func(history, "linear")
    assert history.modules["ident"].call_outputs == ((inp,),)
    assert history.modules["through"].call_outputs == ((linear.label,),)
    assert set(history[inp].output_of_modules) == {"ident:1"}
    assert set(linear.output_of_modules) == {"lin:1", "through:1"}
    assert history["ident"] is history[inp] and history["through"] is linear
    for func in ("to", "contiguous"):
        (record,) = _by_func(history, func)
        assert torch.equal(record.tensor_contents, linear.tensor_contents) and not record.is_inplace


def test_module_called_several_times() -> None:
    torch.manual_seed(0)
    model, x = ReusedModule(), torch.randn(2, 4)
    history = _log(model, x)
    layer = history.layer("linear_1_1")
    assert layer.num_passes == 3
    assert [p.containing_modules for p in layer] == [(f"cell:{k}",) for k in (1, 2, 3)]
    assert all({i.address for i in p.params} == {"cell.weight", "cell.bias"} for p in layer)
    assert layer.parent_layers["tanh_1_2"] == ((1, 2), (2, 3))
    value = x
    for record in layer:
        value = model.cell(value)
        assert torch.equal(record.tensor_contents, value.detach())
        value = torch.tanh(value)


def test_modules_nested_three_deep() -> None:
    torch.manual_seed(0)
    history = _log(Nested(), torch.randn(2, 4))
    linears = _by_func(history, "linear")
    assert [p.containing_modules for p in linears] == [
        ("block1.inner.lin:1", "block1.inner:1", "block1:1"),
        ("block2.inner.lin:1", "block2.inner:1", "block2:1"),
        ("head:1",),
    ]
    assert history.modules["block1"].children == ("block1.inner", "block1.norm")
    assert history.modules["block1.inner"].children == ("block1.inner.lin",)
    (norm1,) = history.modules["block1.norm"].call_outputs
    assert history.modules["block1"].call_outputs == (norm1,)
    assert set(history[norm1[0]].output_of_modules) == {"block1.norm:1", "block1:1"}


def test_structured_inputs_and_outputs() -> None:
    torch.manual_seed(0)
    batch = {"a": torch.randn(2, 3), "nested": [torch.randn(2, 3)]}
    extras = [torch.randn(2, 3), torch.randn(2, 3)]
    model = StructuredIO()
    history = _log(model, batch, extras)
    inputs = [history[label] for label in history.input_layers]
    assert [torch.equal(p.tensor_contents, t) for p, t in
            zip(inputs, [batch["a"], batch["nested"][0], extras[0], extras[1]])] == [True] * 4
    outputs = [history[label] for label in history.output_layers]
    assert [p.parents[0].arg for p in outputs] == [("sum",), ("parts", 0), ("parts", 1, 0), ("parts", 1, 1)]
    assert outputs[3].parent_labels == (inputs[2].label,), "extras[0] is returned unchanged"
    expected = model(batch, extras)
    assert torch.equal(outputs[0].tensor_contents, expected["sum"].detach())


def test_input_kwargs_and_dict_output() -> None:
    torch.manual_seed(0)
    model = StructuredIO()
    batch = {"a": torch.randn(2, 3), "nested": [torch.randn(2, 3)]}
    history = torchlog.log_forward_pass(model, [], input_kwargs={"batch": batch, "extras": [torch.ones(2, 3)] * 2})
    check_history(history)
    assert len(history.input_layers) == 3, "the same tensor passed twice is one input"


def test_x_plus_x_is_one_parent_with_two_edges() -> None:
    x = torch.randn(2, 3)
    history = _log(DoubleUse(), x)
    (inp,) = history.input_layers
    add, mul = _by_func(history, "add")[0], _by_func(history, "mul")[0]
    assert add.parents == (torchlog.records.ParentEdge(inp, 0), torchlog.records.ParentEdge(inp, 1))
    assert add.parent_labels == (inp,) and history[inp].children == (add.label,)
    assert [e.label for e in mul.parents] == [add.label, add.label] and add.children == (mul.label,)
    assert history.layer(add.layer_label).parent_layers == {history[inp].layer_label: ((1,), (1,))}
    assert torch.equal(mul.tensor_contents, (x + x) * (x + x))


@pytest.mark.parametrize("sign", [1, -1])
def test_conditional_on_tensor_value(sign: int) -> None:
    torch.manual_seed(0)
    model, x = Conditional(), sign * torch.rand(2, 3)
    history = _log(model, x)
    taken, skipped = ("pos", "neg") if sign > 0 else ("neg", "pos")
    assert history.modules[taken].num_passes == 1 and history.modules[skipped].num_passes == 0
    assert [p.func_name for p in history] == ["input", "sum", "gt", "linear", "output"]
    assert history[history.output_layers[0]].parent_labels == history.modules[taken].call_outputs[0]


def test_orphan_computations_are_logged_but_not_ancestors() -> None:
    history = _log(Orphans(), torch.randn(3))
    funcs = [p.func_name for p in history]
    assert funcs == ["input", "ones", "mul", "exp", "cos", "sum", "add", "output"]
    upstream = ancestors(history, history.output_layers)
    orphans = [p.func_name for p in history if p.label not in upstream]
    assert orphans == ["ones", "mul", "exp", "cos", "sum"]
    assert torch.equal(_by_func(history, "exp")[0].tensor_contents, torch.exp(torch.ones(3) * 5))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
def test_dropout_and_batchnorm(training: bool) -> None:
    torch.manual_seed(0)
    model, x = TrainEval().train(training), torch.randn(5, 4)
    model.bn.running_mean.fill_(0.5)
    history = _log(model, x, random_seed=4)
    (bn,) = _by_func(history, "batch_norm")
    (drop,) = _by_func(history, "dropout")
    expected_bn = (x - x.mean(0)) / torch.sqrt(x.var(0, unbiased=False) + 1e-5) if training \
        else (x - 0.5) / torch.sqrt(torch.tensor(1.0 + 1e-5))
    torch.testing.assert_close(bn.tensor_contents, expected_bn.detach())
    if training:
        zeros = drop.tensor_contents == 0
        assert zeros.any() and not zeros.all()
        kept = ~zeros
        torch.testing.assert_close(drop.tensor_contents[kept], 2 * bn.tensor_contents[kept])
    else:
        assert torch.equal(drop.tensor_contents, bn.tensor_contents)
    buffers = {p.buffer_address for p in history if p.is_buffer}
    assert {"bn.running_mean", "bn.running_var"} <= buffers


def test_multi_output_ops() -> None:
    torch.manual_seed(0)
    x = torch.randn(5, 4)
    history = _log(MultiOutput(), x)
    a, b = _by_func(history, "split")
    assert (a.output_index, b.output_index) == (0, 1) and a.parents == b.parents
    assert torch.equal(a.tensor_contents, x[:, :2]) and torch.equal(b.tensor_contents, x[:, 2:])
    values, indices = _by_func(history, "max")
    assert values.dtype == x.dtype and indices.dtype == torch.int64
    assert torch.equal(values.tensor_contents, x.max(-1).values)
    assert torch.equal(indices.tensor_contents, x.max(-1).indices)
    lstm = _by_func(history, "lstm")
    assert [p.output_index for p in lstm] == [0, 1, 2]
    assert [p.shape for p in lstm] == [(1, 5, 3), (1, 1, 3), (1, 1, 3)]


def test_no_grad_inside_integer_and_bool_tensors() -> None:
    x = torch.randn(3, 4, requires_grad=True)
    history = _log(NoGradInside(), x)
    (gt,) = _by_func(history, "gt")
    assert gt.dtype == torch.bool and torch.equal(gt.tensor_contents, x > 0)
    (argmax,) = _by_func(history, "argmax")
    assert argmax.dtype == torch.int64
    (mx,) = _by_func(history, "max")
    assert mx.shape == () and mx.grad_fn_name is None
    (div,) = _by_func(history, "div")
    assert div.grad_fn_name == "DivBackward0"


def test_metadata_calls_are_not_nodes() -> None:
    history = _log(MetadataCalls(), torch.randn(2, 3))
    assert [p.func_name for p in history] == ["input", "reshape", "mul", "output"]


def test_only_the_calling_threads_ops_are_logged() -> None:
    torch.manual_seed(0)
    model, x = ReusedModule(), torch.randn(2, 4)
    reference = _log(model, x, random_seed=0)
    stop, progress = threading.Event(), []

    def busy() -> None:
        while not stop.is_set():
            model(torch.randn(2, 4)).sin()  # same modules, so torchlog's hooks fire here too
            progress.append(1)

    worker = threading.Thread(target=busy)
    worker.start()
    while not progress:
        stop.wait(0.001)
    try:
        before = len(progress)
        for _ in range(20):
            history = _log(model, x, random_seed=0)
            assert history.layer_labels == reference.layer_labels
            assert [m.num_passes for m in history.modules.values()] == [3, 3]
    finally:
        stop.set()
        worker.join()
    assert len(progress) > before, "the other thread never ran while logging"
