"""Replay validation on the cases of issue 15: no crash, no false alarm, arguments and context
as the op saw them, and a report instead of an exception."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import torchlog
from tests.models import Func
from torchlog.validation import ReplayReport, validate_saved_activations
from torchlog.validation.perturbation import perturbed


class ZeroWeight(nn.Module):
    """A spatial-transformer style head: a Linear initialised to zero weight."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        nn.init.zeros_(self.fc.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) + 1


class LayerScale(nn.Module):
    """A residual branch scaled far under the comparison tolerance (ConvNeXt layer scale)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.gamma = nn.Parameter(torch.full((4,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.gamma * self.fc(x)


def _init_in_forward(x: torch.Tensor) -> torch.Tensor:
    w = x * 0 + 1
    nn.init.uniform_(w)
    return w + x


def _dense(x: torch.Tensor) -> torch.Tensor:
    feats = [x]
    for _ in range(3):
        y = torch.cat(feats, 1)
        feats.append(y.sum(1, keepdim=True))
    return torch.cat(feats, 1)


def _huge_int(x: torch.Tensor) -> torch.Tensor:
    ids = torch.tensor([3, torch.iinfo(torch.int64).max])
    return x * ids.clamp(max=10) + x * ids


def _autocast(x: torch.Tensor) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return torch.mm(x, x.t())


NO_FALSE_ALARMS = {
    "all_nan": (Func(lambda x: torch.log(x - 10)), []),
    "rounding": (Func(lambda x: x * 1e10 + 1e10 + torch.ones(3, 4)), []),
    "zero_weight": (ZeroWeight(), [("linear_1_1", "parent 'input_1_0': other values in it "
                                    "did not move the output")]),
    "init_in_forward": (Func(_init_in_forward), []),
    "bernoulli_p": (Func(lambda x: torch.bernoulli(x, p=0.5)), []),
    "empty_slice": (Func(lambda x: x[:0].sum() + x), [
        ("sum_1_2", "parent 'getitem_1_1': no perturbation of it could be run")]),
    "layer_scale": (LayerScale(), []),
    "dense_cat": (Func(_dense), []),
    "autocast": (Func(_autocast), []),
}


@pytest.mark.parametrize("name", list(NO_FALSE_ALARMS))
def test_right_activations_validate(name: str, capsys: pytest.CaptureFixture) -> None:
    torch.manual_seed(0)
    model, inconclusive = NO_FALSE_ALARMS[name]
    report = validate_saved_activations(model, torch.rand(3, 4), random_seed=0, verbose=True,
                                        return_report=True)
    assert isinstance(report, ReplayReport)
    assert report.problems == [], capsys.readouterr().out
    assert [(p.label, p.detail) for p in report.inconclusive] == inconclusive
    assert validate_saved_activations(model, torch.rand(3, 4), random_seed=0) is True


def test_integer_values_out_of_perturbation_range_never_raise() -> None:
    report = validate_saved_activations(Func(_huge_int), torch.rand(3, 2), random_seed=0,
                                        return_report=True)
    assert report.passed
    assert [p.label for p in report.inconclusive] == ["clamp_1_2"]
    assert report.num_perturbed == 6  # both parents of each mul and of the add


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.uint8])
def test_integer_perturbations_stay_in_the_dtypes_range(dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    t = torch.tensor([info.min, 3, info.max], dtype=dtype)
    other = perturbed(t, torch.Generator().manual_seed(0))
    assert other is not None and other.dtype == dtype
    assert int(other.min()) >= info.min and int(other.max()) <= info.max


def test_float_perturbations_stay_finite_and_reach_the_outputs_size() -> None:
    t = torch.full((64,), 60000.0, dtype=torch.float16)
    other = perturbed(t, torch.Generator().manual_seed(0), scale=1e30)
    assert bool(torch.isfinite(other).all())
    large = perturbed(torch.ones(64), torch.Generator().manual_seed(0), scale=1e10)
    assert float(large.abs().max()) > 1e9


def test_lists_in_recorded_arguments_are_copied_at_call_time() -> None:
    history = torchlog.log_forward_pass(Func(_dense), torch.rand(3, 4), random_seed=0,
                                        save_function_args=True)
    cats = [p for p in history if p.func_name == "cat"]
    assert [len(p.func_args[1][0]) for p in cats] == [1, 2, 3, 4]
    assert [p.label for p in cats] == ["cat_1_1:1", "cat_1_1:2", "cat_1_1:3", "cat_2_3"]


def test_autocast_grad_and_inference_mode_are_recorded_per_op() -> None:
    def modes(x: torch.Tensor) -> torch.Tensor:
        y = _autocast(x)
        with torch.no_grad():
            z = x * 2
        with torch.inference_mode():
            w = x + 1
        return y.float() + z + w

    history = torchlog.log_forward_pass(Func(modes), torch.rand(3, 3), random_seed=0,
                                        save_function_args=True)
    contexts = {p.label: p.extra.get("op_context") for p in history if p.kind == "op"}
    assert contexts == {
        "t_1_1": {"autocast": {"cpu": "bfloat16"}}, "mm_1_2": {"autocast": {"cpu": "bfloat16"}},
        "mul_1_3": {"grad": False}, "add_1_4": {"grad": False, "inference": True},
        "float_1_5": None, "add_2_6": None, "add_3_7": None,
    }
    assert history["mm_1_2"].dtype == torch.bfloat16
    assert validate_saved_activations(Func(modes), torch.rand(3, 3), random_seed=0)


def test_ordinary_logging_records_no_context() -> None:
    history = torchlog.log_forward_pass(Func(_autocast), torch.rand(3, 3), random_seed=0)
    assert all(p.extra == {} for p in history)


def test_verbose_lists_problems_and_inconclusive_edges(capsys: pytest.CaptureFixture) -> None:
    history = torchlog.log_forward_pass(ZeroWeight(), torch.rand(3, 4), random_seed=0,
                                        save_function_args=True, detach_saved_tensors=True)
    target = history["add_1_2"]
    target.saved = target.saved + 1
    report = torchlog.validation.find_replay_problems(history)
    torchlog.validation.report.print_report(report)
    out = capsys.readouterr().out
    assert "add_1_2: replay check failed" in out
    assert "linear_1_1: inconclusive perturb check: parent 'input_1_0'" in out
    assert "1 inconclusive, 1 problems" in out
    assert validate_saved_activations(ZeroWeight(), torch.rand(3, 4), random_seed=0, verbose=True)
    out = capsys.readouterr().out
    assert "linear_1_1: inconclusive perturb check: parent 'input_1_0'" in out
    assert "torchlog validation passed:" in out and "1 inconclusive, 0 problems" in out


class OnlyOnce(nn.Module):
    """A model with outside state: its second forward raises."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        y = self.fc(x)
        if self.runs > 1:
            raise RuntimeError("the stream was already consumed")
        return y


def test_a_model_that_cannot_be_replayed_gives_a_report_with_the_reason() -> None:
    report = validate_saved_activations(OnlyOnce(), torch.rand(1, 2), random_seed=0,
                                        return_report=True)
    assert not report.passed and [(p.label, p.check) for p in report.problems] == [("model", "run")]
    detail = report.problems[0].detail
    assert "RuntimeError raised by Python code at the model's top level" in detail
    assert "cannot be replayed" in detail
    assert validate_saved_activations(OnlyOnce(), torch.rand(1, 2), random_seed=0) is False


PACKED_LSTM = textwrap.dedent("""
    import torch, torchlog
    from torch import nn
    from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(4, 5, batch_first=True)

        def forward(self, x):
            packed = pack_padded_sequence(x, torch.tensor([5, 3, 2]), batch_first=True)
            out, _ = self.lstm(packed)
            return pad_packed_sequence(out, batch_first=True)[0]

    torch.manual_seed(0)
    report = torchlog.validate_saved_activations(Packed(), torch.rand(3, 5, 4), random_seed=0,
                                                 return_report=True)
    print(report.passed, report.num_replayed, sorted({p.label for p in report.inconclusive}))
""")


def test_packed_sequence_lstm_validates_without_crashing_the_process() -> None:
    done = subprocess.run([sys.executable, "-c", PACKED_LSTM], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == (
        "True 12 ['getitem_1_5', 'lstm_1_8', 'packpaddedsequence_1_3', 'padpackedsequence_1_11', "
        "'to_1_2']")
