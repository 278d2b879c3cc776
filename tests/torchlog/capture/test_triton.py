"""Triton kernel launches logged as ops (torchlog/capture/triton/), on the CPU interpreter."""
from __future__ import annotations

import copy
import sys
import textwrap

import pytest
import torch
from torch import nn

import torchlog
from tests.invariants import check_history, check_module_outputs, record_module_outputs

triton = pytest.importorskip("triton")  # an optional dependency, in the dev extra

from triton.runtime.jit import KernelInterface  # noqa: E402

from tests import triton_models as tm  # noqa: E402
from torchlog.capture import CaptureOptions, Recorder  # noqa: E402
from torchlog.capture.triton import log_triton_launches, node_name  # noqa: E402
from torchlog.capture.triton.source import read_arg_access  # noqa: E402

_LAUNCH_SYNTAX = KernelInterface.__dict__["__getitem__"]


def log(model: nn.Module, *inputs: torch.Tensor, **kwargs) -> torchlog.ModelHistory:
    kwargs.setdefault("random_seed", 0)
    history = torchlog.log_forward_pass(model, list(inputs), **kwargs)
    check_history(history)
    return history


def kernel_passes(history: torchlog.ModelHistory) -> list:
    return [p for p in history if p.func_name.startswith("triton_")]


def parents_by_slot(record) -> dict:
    return {edge.arg: edge.label for edge in record.parents}


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=tm.DEVICE)


# ----- one kernel, one node ---------------------------------------------------------------------
def test_elementwise_kernel_is_a_node_between_its_producers_and_readers():
    torch.manual_seed(0)
    model = tm.ElementwiseModel().to(tm.DEVICE)
    x = randn(3, 12)
    history = log(model, x)
    (add,) = kernel_passes(history)
    assert add.label == "triton_add_1_3"
    assert add.layer_type == "triton_add"
    assert parents_by_slot(add) == {0: "linear_1_1", 1: "input_1_0", 2: "emptylike_1_2"}
    assert add.children == ("relu_1_4",)
    assert history["relu_1_4"].parent_labels == ("triton_add_1_3",)
    with torch.no_grad():
        expected = model.fc(x) + x
    assert torch.allclose(add.tensor_contents, expected)
    assert torch.equal(history["relu_1_4"].tensor_contents, torch.relu(add.tensor_contents))
    assert add.extra["kernel"] == "add_kernel"
    assert add.extra["grid"] == (triton.cdiv(36, 8),)
    assert add.extra["constexprs"] == {"BLOCK": 8}
    assert add.extra["written_args"] == ("out_ptr",)
    assert add.extra["write_detection"] == "source"
    assert "launch" not in add.extra  # only kept with save_function_args


def test_node_name_drops_a_kernel_suffix_only():
    assert node_name("act_quant_kernel") == "triton_act_quant"
    assert node_name("matmul") == "triton_matmul"
    assert node_name("_kernel") == "triton__kernel"


# ----- DeepSeek-V3 style: act_quant (two outputs) feeding a block-scaled GEMM -----------------------
def test_quantised_mlp_kernels_link_outputs_to_their_readers():
    torch.manual_seed(0)
    model = tm.QuantMLP().to(tm.DEVICE)
    x = randn(2, 8, 32)
    seen, plain_output = record_module_outputs(copy.deepcopy(model), (x,))
    history = log(model, x)
    check_module_outputs(history, model, seen)
    assert torch.equal(history[-1].tensor_contents, plain_output)

    quant = [p for p in kernel_passes(history) if p.layer_type == "triton_act_quant"]
    gemms = [p for p in kernel_passes(history) if p.layer_type == "triton_scaled_gemm"]
    assert [p.output_index for p in quant] == [0, 1, 0, 1] and len(gemms) == 2
    for (values, scales), gemm, module in zip((quant[:2], quant[2:]), gemms, ("up", "down")):
        assert values.dtype == torch.float8_e4m3fn and scales.dtype == torch.float32
        assert values.extra["written_args"] == ("y_ptr", "s_ptr")
        assert values.containing_modules == (f"{module}:1",)
        # The GEMM reads the quantised values (slot 0) and scales (slot 3) from act_quant.
        assert parents_by_slot(gemm)[0] == values.label
        assert parents_by_slot(gemm)[3] == scales.label
        assert gemm.label in values.children and gemm.label in scales.children
        assert {p.address for p in gemm.params} == {f"{module}.weight", f"{module}.scale"}
        # Saved activations are what the kernel really wrote: rerun it on the logged input.
        quant_input = history[parents_by_slot(values)[0]].tensor_contents
        want_values, want_scales = tm.act_quant(quant_input, 16)
        assert torch.equal(values.tensor_contents.view(torch.uint8), want_values.view(torch.uint8))
        assert torch.equal(scales.tensor_contents, want_scales)
        want_c = tm.scaled_gemm(want_values, want_scales, getattr(model, module).weight,
                                getattr(model, module).scale)
        assert torch.equal(gemm.tensor_contents, want_c)


# ----- loops, autotuning, atomics, helpers, descriptors ------------------------------------------
def test_kernel_launched_in_a_loop_folds_into_one_layer():
    x, y = randn(10), randn(10)
    history = log(tm.KernelLoop(), x, y)
    layer = history.layers[[lay.layer_type for lay in history.layers].index("triton_add")]
    assert layer.num_passes == 4
    assert [p.label for p in layer.passes] == [f"{layer.label}:{k}" for k in range(1, 5)]
    for k, record in enumerate(layer.passes, start=1):
        assert torch.allclose(record.tensor_contents, x + k * y)
        if k > 1:
            assert parents_by_slot(record)[0] == layer.passes[k - 2].label
    assert history[f"{layer.label}:4"].children == ("mul_1_4",)


def test_autotuned_kernel_is_one_node_with_the_chosen_config():
    x, y = randn(32), randn(32)
    history = log(tm.TunedModel(), x, y)
    # Benchmark runs and the config's pre-hook launches are part of the launch, not nodes.
    (mul,) = kernel_passes(history)
    config = tm.tuned_mul_kernel.best_config
    block = config.kwargs["BLOCK"]
    assert mul.layer_type == "triton_tuned_mul"
    assert mul.extra["constexprs"] == {"BLOCK": block, "EVEN": 32 % block == 0}
    assert mul.extra["options"]["num_warps"] == config.num_warps
    assert mul.extra["grid"] == (triton.cdiv(32, block),)
    assert parents_by_slot(mul)[0] == "sin_1_2"
    assert torch.allclose(mul.tensor_contents, torch.sin(x) * y)
    assert mul.children == ("add_1_5",)


def test_atomic_update_is_an_inplace_write_of_the_buffer():
    x = randn(4, 10)
    history = log(tm.AtomicRowSum(), x)
    (row_sum,) = kernel_passes(history)
    assert row_sum.is_inplace
    assert parents_by_slot(row_sum) == {0: "input_1_0", 1: "zeros_1_1"}
    assert torch.allclose(row_sum.tensor_contents, x.sum(dim=1), atol=1e-5)
    assert torch.equal(history["zeros_1_1"].tensor_contents, torch.zeros(4, device=tm.DEVICE))
    assert row_sum.children == ("exp_1_3",)


def test_kernel_writing_an_argument_it_reads_is_inplace():
    x, y = randn(10), randn(10)
    history = log(tm.InplaceAddModel(), x, y)
    (add,) = kernel_passes(history)
    assert add.is_inplace
    assert parents_by_slot(add) == {0: "add_1_2", 1: "input_2_1", 2: "add_1_2"}
    assert torch.allclose(add.tensor_contents, x + 1 + y)
    assert torch.allclose(history["add_1_2"].tensor_contents, x + 1)  # saved before the kernel
    assert history["mul_1_4"].parent_labels == (add.label,)


def test_writes_through_helpers_and_passed_functions_are_found():
    x = randn(10)
    history = log(tm.HelperStoreModel(), x)
    double, apply = kernel_passes(history)
    assert double.extra["write_detection"] == "source"  # the jit helper's store was read
    assert apply.extra["write_detection"] == "source+contents"  # STORE is only known at launch
    assert double.extra["written_args"] == apply.extra["written_args"] == ("out_ptr",)
    assert torch.equal(double.tensor_contents, x * 2)
    assert torch.equal(apply.tensor_contents, x * 4)
    assert parents_by_slot(apply)[0] == double.label
    assert history["sub_1_5"].parent_labels == (apply.label, double.label)


def test_tensor_descriptor_arguments_are_parents_and_outputs():
    x = randn(16, 8)
    history = log(tm.DescriptorModel(), x)
    (scale,) = kernel_passes(history)
    assert parents_by_slot(scale) == {(0, "base"): "input_1_0", (1, "base"): "emptylike_1_1"}
    assert scale.extra["written_args"] == ("out_desc",)
    assert torch.equal(scale.tensor_contents, x * 3)


# ----- threads, failures, switching off ---------------------------------------------------------------
def test_launches_from_other_threads_are_not_logged():
    history = log(tm.OtherThreadModel(), randn(10))
    assert [p.label for p in kernel_passes(history)] == ["triton_add_1_3"]


def test_failing_launch_names_the_kernel_and_restores_launch_syntax():
    history = log(tm.FailingLaunchModel(), randn(10), on_error="return")
    assert history.is_partial
    assert "triton_add" in history.info.failure and "ValueError" in history.info.failure
    assert history.info.failed_parents == ("add_1_1", "emptylike_1_2")
    assert KernelInterface.__dict__["__getitem__"] is _LAUNCH_SYNTAX


class _SyntaxProbe(nn.Module):
    """Notes whether kernel launch syntax is wrapped while forward runs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.wrapped = KernelInterface.__dict__["__getitem__"] is not _LAUNCH_SYNTAX
        return x * 2


def test_launch_syntax_is_wrapped_only_while_logging():
    probe = _SyntaxProbe()
    log(probe, randn(3))
    assert probe.wrapped
    assert KernelInterface.__dict__["__getitem__"] is _LAUNCH_SYNTAX


def test_nothing_is_wrapped_when_triton_was_not_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "triton")
    probe = _SyntaxProbe()
    history = log(probe, randn(3))
    assert not probe.wrapped
    assert [p.label for p in history] == ["input_1_0", "mul_1_1", "output_1_2"]


def test_logging_works_when_triton_cannot_be_imported(monkeypatch):
    for name in [n for n in sys.modules if n == "triton" or n.startswith("triton.")]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it now raises ImportError
    probe = _SyntaxProbe()
    history = log(probe, randn(3))
    assert not probe.wrapped
    assert [p.label for p in history] == ["input_1_0", "mul_1_1", "output_1_2"]


class _KeptLauncher(nn.Module):
    """Keeps the launcher `kernel[grid]` made while logging, to call it afterwards."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.launcher = tm.add_kernel[(triton.cdiv(x.numel(), 8),)]
        out = torch.empty_like(x)
        self.launcher(x, x, out, x.numel(), BLOCK=8)
        return out


def test_a_launcher_kept_from_a_logged_pass_still_launches_afterwards():
    model = _KeptLauncher()
    x = randn(10)
    history = log(model, x)
    assert [p.layer_type for p in kernel_passes(history)] == ["triton_add"]
    out = torch.empty_like(x)
    model.launcher(x, x, out, x.numel(), BLOCK=8)
    assert torch.equal(out, x + x)


def test_nested_plugins_restore_launch_syntax_when_the_last_one_leaves():
    model = nn.Identity()
    outer, inner = Recorder(model, CaptureOptions()), Recorder(model, CaptureOptions())
    with log_triton_launches(outer):
        with log_triton_launches(inner):
            assert KernelInterface.__dict__["__getitem__"] is not _LAUNCH_SYNTAX
        assert KernelInterface.__dict__["__getitem__"] is not _LAUNCH_SYNTAX
    assert KernelInterface.__dict__["__getitem__"] is _LAUNCH_SYNTAX


# ----- replay ----------------------------------------------------------------------------------------------
def test_kernel_nodes_replay_from_their_parents_saved_values():
    torch.manual_seed(0)
    model = tm.QuantMLP().to(tm.DEVICE)
    history = log(model, randn(2, 8, 32), save_function_args=True)
    for record in kernel_passes(history):
        launch = record.extra["launch"]
        assert launch.kernel in (tm.act_quant_kernel, tm.scaled_gemm_kernel)
        alone = launch.replay()[record.output_index]
        inputs = {edge.arg: history[edge.label].tensor_contents for edge in record.parents}
        from_parents = launch.replay(inputs)[record.output_index]
        for got in (alone, from_parents):
            assert torch.equal(got.view(torch.uint8), record.tensor_contents.view(torch.uint8))


def test_replay_rejects_a_slot_that_is_not_a_tensor_argument():
    history = log(tm.ElementwiseModel().to(tm.DEVICE), randn(3, 12), save_function_args=True)
    (add,) = kernel_passes(history)
    assert add.extra["launch"].write_only == (2,)  # the output buffer matters by shape only
    with pytest.raises(KeyError, match="'n'"):
        add.extra["launch"].replay({"n": torch.zeros(1)})


def test_replay_starts_from_the_arguments_before_the_launch():
    x = randn(2, 5)
    history = log(tm.AtomicRowSum(), x, save_function_args=True)
    launch = kernel_passes(history)[0].extra["launch"]
    assert launch.write_only == ()  # atomics read what they add to
    for _ in range(2):  # accumulates into a fresh copy of the zeroed buffer each time
        assert torch.allclose(launch.replay()[0], x.sum(dim=1), atol=1e-5)


# ----- reading which arguments a kernel writes ------------------------------------------------------
def test_source_reading_finds_stored_and_loaded_pointers():
    add = read_arg_access(tm.add_kernel)
    assert {"out_ptr"} <= add.written and not {"x_ptr", "y_ptr"} & add.written
    assert {"x_ptr", "y_ptr"} <= add.read and add.is_complete
    quant = read_arg_access(tm.act_quant_kernel)
    assert {"y_ptr", "s_ptr"} <= quant.written and "x_ptr" not in quant.written
    row_sum = read_arg_access(tm.row_sum_kernel)
    assert "out_ptr" in row_sum.written and "out_ptr" in row_sum.read
    gemm = read_arg_access(tm.scaled_gemm_kernel)
    assert "c_ptr" in gemm.written and not {"a_ptr", "b_ptr", "a_s_ptr", "b_s_ptr"} & gemm.written


def test_source_reading_follows_helpers_and_flags_what_it_cannot_follow():
    double = read_arg_access(tm.double_kernel)
    assert "out_ptr" in double.written and "x_ptr" not in double.written
    apply = read_arg_access(tm.apply_kernel)
    assert "out_ptr" not in apply.written and "out_ptr" in apply.untraced
    assert "out_desc" in read_arg_access(tm.scale_rows_kernel).written
    assert read_arg_access(tm.tuned_mul_kernel).written >= {"out_ptr"}


def test_source_reading_gives_up_without_source():
    namespace: dict = {"tl": triton.language}
    exec(textwrap.dedent("""
        def gather_store(table_ptr, value):
            target = tl.load(table_ptr)
            tl.store(target, value)
    """), namespace)
    access = read_arg_access(namespace["gather_store"])  # defined by exec: no source file
    assert not access.is_complete


def test_a_store_through_a_loaded_pointer_is_untraceable(tmp_path, monkeypatch):
    source = tmp_path / "kernels_from_file.py"
    source.write_text(textwrap.dedent("""
        import triton.language as tl

        def scatter_store(table_ptr, value):
            target = tl.load(table_ptr)
            tl.store(target, value)

        def indexed_store(out_ptr, idx_ptr, value):
            tl.store(out_ptr + tl.load(idx_ptr), value)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    import kernels_from_file

    monkeypatch.setitem(sys.modules, "kernels_from_file", kernels_from_file)  # dropped afterwards
    assert not read_arg_access(kernels_from_file.scatter_store).is_complete
    indexed = read_arg_access(kernels_from_file.indexed_store)
    assert indexed.is_complete and indexed.written == {"out_ptr"} and "idx_ptr" in indexed.read
