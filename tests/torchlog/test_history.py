"""ModelHistory lookup and printing against the TorchLens article (seeds/004): the spec for formats."""
from __future__ import annotations

import re

import pytest
import torch

import torchlog
from tests.invariants import check_history
from tests.models import AlexNet, Nested, SimpleRecurrent

SEED_LAYERS = [
    "input_1_0", "conv2d_1_1", "relu_1_2", "maxpool2d_1_3", "conv2d_2_4", "relu_2_5", "maxpool2d_2_6",
    "conv2d_3_7", "relu_3_8", "conv2d_4_9", "relu_4_10", "conv2d_5_11", "relu_5_12", "maxpool2d_3_13",
    "adaptiveavgpool2d_1_14", "flatten_1_15", "dropout_1_16", "linear_1_17", "relu_6_18", "dropout_2_19",
    "linear_2_20", "relu_7_21", "linear_3_22", "output_1_23",
]


@pytest.fixture(scope="module")
def alexnet_history():
    torch.manual_seed(0)
    model = AlexNet().eval()
    history = torchlog.log_forward_pass(model, torch.rand(1, 3, 224, 224), random_seed=3210097511)
    check_history(history)
    return model, history


def test_alexnet_lists_the_seed_layers_in_order(alexnet_history):
    _, history = alexnet_history
    assert history.layer_labels == SEED_LAYERS
    text = str(history)
    listed = re.findall(r"^\s+(\d+): (\S+) $", text, flags=re.M)
    assert [label for _, label in listed] == SEED_LAYERS
    assert [int(i) for i, _ in listed] == list(range(24))


def test_alexnet_summary_lines(alexnet_history):
    model, history = alexnet_history
    lines = str(history).splitlines()
    assert lines[0] == "Log of AlexNet forward pass:"
    assert lines[1] == "    Model structure: purely feedforward, without branching; 23 total modules."
    assert lines[2] == "    24 tensors (4.8 MB) computed in forward pass; 24 tensors (4.8 MB) saved."
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params == 61100840
    assert lines[3] == f"    8 parameter operations ({n_params} params total; 233.1 MB)."
    assert lines[4] == "    Random seed: 3210097511"
    assert re.fullmatch(r"    Time elapsed: \d+\.\d{3}s", lines[5])
    assert lines[6] == "    Module Hierarchy:"
    assert lines[7] == "        features:"
    assert lines[8].startswith("            features.0, features.1, features.2,")
    hierarchy = "\n".join(lines[7:lines.index("    Layers:")])
    assert "        avgpool\n        classifier:\n            classifier.0," in hierarchy


def test_alexnet_layer_printout(alexnet_history):
    _, history = alexnet_history
    text = str(history["conv2d_3_7"]).splitlines()
    assert text[0] == "Layer conv2d_3_7, operation 8/24:"
    assert text[1] == "    Output tensor: shape=(1, 384, 13, 13), dtype=torch.float32, size=253.5 KB"
    assert text[2].lstrip().startswith("tensor([[") and text[6].endswith("]])...")
    body = "\n".join(text[7:])
    assert ("    Params: Computed from params with shape (384,), (384, 192, 3, 3); "
            "663936 params total (2.5 MB)") in body
    for line in ("    Parent Layers: maxpool2d_2_6", "    Child Layers: relu_3_8",
                 "    Function: conv2d (gradfunc=ConvolutionBackward0)",
                 "    Computed inside module: features.6", "    Output of modules: features.6",
                 "    Output of bottom-level module: features.6",
                 "    Lookup keys: -17, 7, conv2d_3_7, conv2d_3_7:1, features.6, features.6:1"):
        assert line in text, line
    assert any(re.fullmatch(r"    Time elapsed:  \d\.\d{3}E-?\d+s", line) for line in text)


def test_alexnet_equivalent_keys_find_the_same_layer(alexnet_history):
    _, history = alexnet_history
    record = history["conv2d_3_7"]
    for key in ("conv2d_3", "conv2d_3_7:1", "features.6", "features.6:1", 7, -17):
        assert history[key] is record, key
    assert history["features"].label == "maxpool2d_3_13"
    assert history["classifier"].label == "linear_3_22"
    assert record.tensor_contents.shape == (1, 384, 13, 13)


def test_layers_to_save_seed_example():
    torch.manual_seed(0)
    model = AlexNet().eval()
    x = torch.rand(1, 3, 224, 224)
    history = torchlog.log_forward_pass(model, x, layers_to_save=["conv2d_3_7", "features", -5, "linear"],
                                        random_seed=1)
    # The seed's printed list, exactly: the chosen layers only, in execution order.
    assert history.layer_labels == ["conv2d_3_7", "maxpool2d_3_13", "linear_1_17", "dropout_2_19",
                                     "linear_2_20", "linear_3_22"]
    assert history.output_layers == history.input_layers == [] and "output_1_23" not in history
    check_history(history)
    full = torchlog.log_forward_pass(model, x, random_seed=1)
    for record in history:
        assert torch.equal(record.tensor_contents, full[record.label].tensor_contents)


def test_selective_save_with_randomness_equals_full_save_filtered():
    torch.manual_seed(0)
    model = AlexNet(num_classes=10).train()  # dropout draws random numbers
    x = torch.rand(1, 3, 96, 96)
    part = torchlog.log_forward_pass(model, x, layers_to_save=["dropout", "linear_3"], random_seed=7)
    full = torchlog.log_forward_pass(model, x, random_seed=7)
    assert part.layer_labels == ["dropout_1_16", "dropout_2_19", "linear_3_22"]
    for record in part:
        assert torch.equal(record.tensor_contents, full[record.label].tensor_contents)


def test_keep_unsaved_layers_keeps_metadata():
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), layers_to_save=["add"],
                                        keep_unsaved_layers=True)
    check_history(history)
    assert len(history) == 14
    assert [p.label for p in history if p.has_saved_tensor] == [f"add_1_2:{k}" for k in range(1, 5)]
    assert history["linear_1_1:1"].tensor_contents is None
    assert history["linear_1_1:1"].tensor_meta.shape == (2, 5)


def test_a_pruned_history_lists_only_what_it_holds_and_names_what_it_left_out():
    # Every list on a history names passes it holds (as layer_labels does), so each lookup
    # of a listed label answers; a lookup of a pass the list left out says so.
    model, x = SimpleRecurrent(), torch.rand(2, 5)
    pruned = torchlog.log_forward_pass(model, x, layers_to_save=["mul_1_3:4"])
    assert pruned.layer_labels == ["mul_1_3:4"] and pruned.output_layers == pruned.input_layers == []
    assert pruned.module_tree().startswith("SimpleRecurrent(")  # looked up every output_layers label
    for key, label in [("output_1_4", "output_1_4"), ("output_1", "output_1_4"), ("mul_1_3:2", "mul_1_3:2"),
                       ("linear_1_1:2", "linear_1_1:2"), ("input_1_0", "input_1_0")]:
        with pytest.raises(torchlog.LayerNotFoundError,
                           match=rf"'{key}' names pass '{label}' of this run, which layers_to_save left out.*"
                                 rf"add '{label}' to layers_to_save.*keep_unsaved_layers=True"):
            pruned[key]
    with pytest.raises(torchlog.LayerNotFoundError,
                       match=r"call 2 of module 'fc' returned 'linear_1_1:2', which is not in this history "
                             r"\(layers_to_save left it out\); add 'fc:2'"):
        pruned["fc:2"]
    chosen = torchlog.log_forward_pass(model, x, layers_to_save=["mul_1_3:4", "output", "input"])
    kept = torchlog.log_forward_pass(model, x, layers_to_save=["mul_1_3:4"], keep_unsaved_layers=True)
    full = torchlog.log_forward_pass(model, x)
    for history in (pruned, chosen, kept, full):
        check_history(history)
        for name in ("input_layers", "output_layers"):
            labels = getattr(history, name)
            assert labels == [label for label in history.layer_labels if label in labels]
            assert all(history[label].label == label for label in labels)
    assert chosen.output_layers == kept.output_layers == full.output_layers == ["output_1_4"]
    assert chosen.input_layers == kept.input_layers == ["input_1_0"]
    assert torch.equal(chosen["output_1_4"].tensor_contents, model(x).detach())
    assert kept["output_1_4"].tensor_contents is None and kept["output_1_4"].tensor_meta.shape == (2, 5)


def test_a_stopped_history_says_a_key_is_after_the_stop():
    # Stopped inside module '0' (after its submodule '0.1' returned): call 1 of '0' has no
    # output. The message says the output comes after the stop, and never offers the very
    # key that failed ("use '0:1'..'0:1'").
    def block() -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.ReLU())

    model, x = torch.nn.Sequential(block(), block()), torch.rand(1, 3)
    history = torchlog.log_forward_pass(model, x, stop_after="0.1:1")
    check_history(history)
    assert history.stopped_at == "relu_1_2" and history.modules["0"].call_outputs == ((),)
    for key in ("0", "0:1"):
        with pytest.raises(torchlog.LayerNotFoundError) as raised:
            history[key]
        message = str(raised.value)
        assert message.startswith("call 1 of module '0' had not returned when stop_after ended the forward "
                                  "pass after 'relu_1_2': its output comes after the stop")
        assert "use '0:1'" not in message and "different" not in message
    after = r"^module '0' was called 1 time before stop_after ended the forward pass after 'relu_1_2': call 2"
    with pytest.raises(torchlog.LayerNotFoundError, match=after + r", if the model makes it, is after the stop$"):
        history["0:2"]
    with pytest.raises(torchlog.LayerNotFoundError, match=r"^module '1' was not called before stop_after ended"):
        history["1:1"]
    with pytest.raises(torchlog.LayerNotFoundError, match=r"^no layer matches 'linear_2_3' \(stop_after ended the "
                                                          r"forward pass after 'relu_1_2': later passes are not"):
        history["linear_2_3"]
    assert history["0.1"].label == "relu_1_2"  # the call that returned before the stop is found


def test_a_partial_history_says_a_module_call_may_not_have_returned():
    class Raises(torch.nn.Module):
        def forward(self, x):
            torch.relu(x)
            raise ValueError("the model's own error")

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.bad, self.c = torch.nn.Linear(3, 3), Raises(), torch.nn.Linear(3, 3)

        def forward(self, x):
            return self.c(self.bad(self.a(x)))

    history = torchlog.log_forward_pass(Outer(), torch.rand(1, 3), on_error="return")
    assert history.is_partial and history.output_layers == []
    with pytest.raises(torchlog.LayerNotFoundError, match=r"^call 1 of module 'bad' has no output: it returned no "
                                                          r"tensor, or had not returned when the forward pass raised"):
        history["bad"]
    with pytest.raises(torchlog.LayerNotFoundError, match=r"^module 'c' was not called before the forward pass "
                                                          r"raised$"):
        history["c"]


def test_a_module_that_returns_no_tensor_is_named_as_such():
    class Silent(torch.nn.Module):
        def forward(self, x):
            return None

    class Outer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.silent, self.fc = Silent(), torch.nn.Linear(3, 3)

        def forward(self, x):
            self.silent(x * 2)
            return self.fc(x)

    history = torchlog.log_forward_pass(Outer(), torch.rand(1, 3))
    for key in ("silent", "silent:1"):
        with pytest.raises(torchlog.LayerNotFoundError,
                           match=r"^call 1 of module 'silent' returned no tensor, so no pass is its output; the "
                                 r"passes it ran are in history.modules\['silent'\].call_layers\[0\]$"):
            history[key]
    with pytest.raises(torchlog.LayerNotFoundError, match=r"^module 'silent' was called 1 time, so 'silent:2' does "
                                                          r"not exist; use 'silent:1'$"):
        history["silent:2"]


def test_layers_to_save_none_keeps_every_layer_without_tensors():
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5), layers_to_save=None)
    assert len(history) == 14 and history.num_saved == 0


def test_multi_pass_layer_without_pass_gives_all_passes():
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5))
    layer = history["linear_1_1"]
    assert isinstance(layer, torchlog.LayerRecord) and layer.num_passes == 4
    assert layer[2] is history["linear_1_1:2"] is history["linear_1:2"] is history["fc:2"]
    assert len(layer.tensor_contents) == 4


def test_unknown_key_lists_forms_and_closest_labels():
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5))
    with pytest.raises(torchlog.LayerNotFoundError) as info:
        history["linear_1_2"]
    message = str(info.value)
    assert isinstance(info.value, KeyError)
    assert "'linear_1_2'" in message and "module address" in message and "linear_1_1" in message
    with pytest.raises(KeyError, match="passes 1..4"):
        history["linear_1_1:5"]
    with pytest.raises(KeyError, match="out of range"):
        history[99]
    with pytest.raises(TypeError, match="1.5"):
        history[1.5]


def test_nested_module_records_and_containing_modules():
    history = torchlog.log_forward_pass(Nested(), torch.rand(2, 4))
    check_history(history)
    lin = history["block2.inner.lin"]
    assert lin.containing_modules == ("block2.inner.lin:1", "block2.inner:1", "block2:1")
    assert history["block1"].label == history["block1.norm"].label
    module = history.modules["block1.inner"]
    assert module.type_name == "Inner" and module.num_passes == 1
    assert module.call_outputs == ((history["block1.inner"].label,),)


def test_to_pandas_has_one_row_per_pass():
    history = torchlog.log_forward_pass(SimpleRecurrent(), torch.rand(2, 5))
    frame = history.to_pandas()
    assert list(frame["label"]) == history.layer_labels
    assert list(frame["pass_num"])[1:4] == [1, 1, 1]
    assert frame.loc[frame.label == "linear_1_1:3", "num_params"].item() == 30


def test_import_torchlog_stays_light():
    import subprocess
    import sys

    code = ("import sys, torchlog; heavy = [m for m in ('graphviz', 'h5py', 'pandas', 'IPython') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
