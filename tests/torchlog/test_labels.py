"""Label grammar (torchlog/labels.py)."""
import pytest

from torchlog.labels import layer_label, layer_type_of, parse_label, pass_label, split_pass


@pytest.mark.parametrize("func, expected", [
    ("conv2d", "conv2d"), ("max_pool2d", "maxpool2d"), ("adaptive_avg_pool2d", "adaptiveavgpool2d"),
    ("__add__", "add"), ("relu_", "relu"), ("__getitem__", "getitem"), ("triton_act_quant", "triton_act_quant"),
])
def test_layer_type_of(func, expected):
    assert layer_type_of(func) == expected


def test_format_and_parse_round_trip():
    assert layer_label("conv2d", 3, 7) == "conv2d_3_7"
    assert pass_label("linear_1_1", 2, 4) == "linear_1_1:2"
    assert pass_label("conv2d_3_7", 1, 1) == "conv2d_3_7"
    assert parse_label("conv2d_3_7") == ("conv2d", 3, 7, None)
    assert parse_label("linear_1_1:2") == ("linear", 1, 1, 2)
    assert parse_label("conv2d_3") == ("conv2d", 3, None, None)
    assert parse_label("triton_act_quant_1_12") == ("triton_act_quant", 1, 12, None)
    assert parse_label("features.6") is None


def test_split_pass():
    assert split_pass("features.3:2") == ("features.3", 2)
    assert split_pass("conv2d_3_7") == ("conv2d_3_7", None)
    with pytest.raises(ValueError, match="'x:0'"):
        split_pass("x:0")
