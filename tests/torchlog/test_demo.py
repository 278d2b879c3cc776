"""The built-in example model: exact labels, and the demo command's printout and viewer page."""
from __future__ import annotations

import torch

import torchlog
from torchlog.demo import DemoNet, run_demo


def test_demo_model_labels_keep_the_residual_add_apart_from_the_loop():
    history = torchlog.log_forward_pass(DemoNet().eval(), torch.rand(1, 3, 32, 32), random_seed=0)
    torchlog.lint(history)
    assert history.layer_labels == [
        "input_1_0", "conv2d_1_1", "buffer_1_2", "buffer_2_3", "batchnorm_1_4", "relu_1_5",
        "conv2d_2_6", "relu_2_7", "add_1_8", "adaptiveavgpool2d_1_9", "flatten_1_10",
        "linear_1_11:1", "tanh_1_12:1", "add_2_13:1", "linear_1_11:2", "tanh_1_12:2", "add_2_13:2",
        "linear_1_11:3", "tanh_1_12:3", "add_2_13:3", "linear_2_14", "output_1_15"]
    # The demo lives inside the package, yet its lines are the call sites (user code).
    assert history["add_1_8"].call_site.endswith("demo.py:25 in forward")


def test_demo_prints_the_history_and_writes_the_viewer(tmp_path):
    text = run_demo(str(tmp_path / "demo.html"))
    assert text.startswith("Log of DemoNet forward pass:")
    assert f"Interactive viewer written to {tmp_path / 'demo.html'}" in text
    page = (tmp_path / "demo.html").read_text(encoding="utf-8")
    assert '"model":"DemoNet"' in page
