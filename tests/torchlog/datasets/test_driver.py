"""The dataset driver: values equal forward-hook captures, every data form, stop_after, and bad input."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchlog
from torchlog.datasets import keep, run_dataset, statistics
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError


class Net(nn.Module):
    """Keyword inputs, a module called twice, and ops outside modules."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 6)
        self.act = nn.ReLU()
        self.fc2 = nn.Linear(6, 3)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        h = self.act(self.fc1(x))
        h = self.act(h * 2 if scale is None else h * scale)
        return torch.tanh(self.fc2(h))


def _collect(model: nn.Module, data, sites, **keywords) -> dict:
    found: dict = {}
    run_dataset(model, data, sites, lambda site, i, v: found.setdefault(site, []).append((i, v)),
                progress=False, **keywords)
    return found


def _hook_outputs(model: nn.Module, address: str, batches: list, call=lambda m, b: m(b)) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    handle = model.get_submodule(address).register_forward_hook(lambda m, a, out: seen.append(out.detach().clone()))
    try:
        with torch.no_grad():
            for batch in batches:
                call(model, batch)
    finally:
        handle.remove()
    return seen


def test_values_equal_forward_hook_captures() -> None:
    torch.manual_seed(0)
    model = Net()
    batches = [torch.randn(n, 4) for n in (3, 5, 2)]
    found = _collect(model, batches, ["fc1", "act", "act:2", "tanh_1_6"])
    assert [i for i, _ in found["fc1"]] == [0, 1, 2]
    for (i, value), expected in zip(found["fc1"], _hook_outputs(model, "fc1", batches)):
        assert torch.equal(value, expected)
    hooked_act = _hook_outputs(model, "act", batches)  # two calls per batch
    assert len(found["act"]) == 6
    for (_, value), expected in zip(found["act"], hooked_act):
        assert torch.equal(value, expected)
    for (_, value), expected in zip(found["act:2"], hooked_act[1::2]):
        assert torch.equal(value, expected)
    with torch.no_grad():
        outputs = [model(b) for b in batches]
    assert [torch.equal(v, o) for (_, v), o in zip(found["tanh_1_6"], outputs)] == [True] * 3


def test_selectors_and_dict_batches_through_the_lean_capture() -> None:
    torch.manual_seed(1)
    model = Net()
    batches = [{"x": torch.randn(4, 4), "scale": torch.tensor(0.5)} for _ in range(3)]
    found = _collect(model, batches, [torchlog.select.func("mul")])
    values = [v for _, v in next(iter(found.values()))]
    expected = _hook_outputs(model, "act", batches, call=lambda m, b: m(**b))[0::2]
    assert all(torch.equal(v, e * 0.5) for v, e in zip(values, expected))


def test_dataloader_and_a_generator_of_batches() -> None:
    torch.manual_seed(2)
    model = Net()
    data = torch.randn(21, 4)
    loader = DataLoader(TensorDataset(data), batch_size=8)  # batches are [x]: forward's one argument
    from_loader = statistics(model, loader, ["fc2"], stats=["mean", "var"], progress=False)["fc2"]
    from_tensor = statistics(model, data, ["fc2"], stats=["mean", "var"], batch_size=4, progress=False)["fc2"]
    from_generator = statistics(model, (x for x in data.split(10)), ["fc2"], stats=["mean", "var"],
                                progress=False)["fc2"]
    for found in (from_loader, from_generator):
        assert found.count == from_tensor.count == 21
        torch.testing.assert_close(found.mean, from_tensor.mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(found.var, from_tensor.var, rtol=1e-10, atol=1e-12)


def test_stop_after_ends_each_batch_there() -> None:
    torch.manual_seed(3)
    model = Net()
    ran: list[str] = []
    handle = model.fc2.register_forward_pre_hook(lambda m, a: ran.append("fc2"))
    data = torch.randn(6, 4)
    try:
        found = _collect(model, data, ["fc1", "act:1"], batch_size=3, stop_after="act:1")
    finally:
        handle.remove()
    assert ran == [] and len(found["fc1"]) == 2 and len(found["act:1"]) == 2
    expected = _hook_outputs(model, "act", list(data.split(3)))[0::2]
    assert all(torch.equal(v, e) for (_, v), e in zip(found["act:1"], expected))


def test_the_model_is_left_as_it_was() -> None:
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).train()
    before = model[1].running_mean.clone()
    statistics(model, torch.randn(12, 3) + 5, ["1"], batch_size=4, progress=False)
    assert torch.equal(model[1].running_mean, before) and model.training


def test_a_progress_bar_when_asked(capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("tqdm")
    statistics(Net(), torch.randn(9, 4), ["fc1"], batch_size=3, progress=True)
    assert "3/3" in capsys.readouterr().err


def test_user_sink_objects_and_lists() -> None:
    class Shapes:
        def __init__(self) -> None:
            self.seen: list = []

        def add(self, site, batch_index, value) -> None:
            self.seen.append((site, batch_index, tuple(value.shape)))

        def finish(self) -> list:
            return self.seen

    first, second = run_dataset(Net(), torch.randn(5, 4), ["fc2"], [Shapes(), Shapes()], batch_size=2,
                                progress=False)
    assert first == second == [("fc2", 0, (2, 3)), ("fc2", 1, (2, 3)), ("fc2", 2, (1, 3))]


def test_a_site_that_names_nothing_lists_the_closest() -> None:
    with pytest.raises(InvalidOptionError, match=r"site 'fc3' matches no layer.*closest: fc2"):
        statistics(Net(), torch.randn(4, 4), ["fc3"], progress=False)
    with pytest.raises(InvalidOptionError, match=r"site 'act:3' gave no value in batch 0: module 'act' returned "
                                                 r"a tensor in 2 call\(s\)"):
        statistics(Net(), torch.randn(4, 4), ["act:3"], progress=False)
    with pytest.raises(InvalidArgumentTypeError, match=r"site 1.5 of type float is not accepted"):
        statistics(Net(), torch.randn(4, 4), [1.5], progress=False)


@pytest.mark.parametrize("data, message", [
    (torch.randn(0, 4), "holds no batch"),
    ([], "holds no batch"),
    ((x for x in []), "gave no batch"),
])
def test_empty_data_is_refused_before_the_model_runs(data, message) -> None:
    model = Net()
    ran: list = []
    model.register_forward_pre_hook(lambda m, a: ran.append(1))
    with pytest.raises(InvalidOptionError, match=message):
        statistics(model, data, ["fc1"], batch_size=2 if isinstance(data, torch.Tensor) else None, progress=False)
    assert ran == []


def test_a_reduce_dimension_out_of_range_names_it() -> None:
    with pytest.raises(InvalidOptionError, match=r"reduce=keep\(3\) names dimension 3, but site 'fc1' gives values "
                                                 r"with 2 dimensions"):
        statistics(Net(), torch.randn(4, 4), ["fc1"], reduce=keep(3), progress=False)


@pytest.mark.parametrize("keywords, error, message", [
    ({"stats": ["mean", "median"]}, InvalidOptionError, "unknown statistic 'median'"),
    ({"stats": ["histogram"]}, InvalidOptionError, "needs its bins"),
    ({"reduce": "channels"}, InvalidArgumentTypeError, "reduce='channels' is not accepted"),
    ({"cka": [("fc1", "fc9")]}, InvalidOptionError, "names 'fc9', which is not in sites"),
    ({"batch_size": 0}, InvalidArgumentTypeError, "batch_size must be None or a positive int, got 0"),
])
def test_bad_options_are_refused_before_the_model_runs(keywords, error, message) -> None:
    model = Net()
    ran: list = []
    model.register_forward_pre_hook(lambda m, a: ran.append(1))
    with pytest.raises(error, match=message):
        statistics(model, torch.randn(4, 4), ["fc1"], progress=False, **keywords)
    assert ran == []


def test_a_batch_running_other_ops_before_a_site_is_refused() -> None:
    class Branchy(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.sin(x) if x.shape[0] > 2 else torch.cos(x)
            return torch.exp(x)

    with pytest.raises(InvalidOptionError, match=r"batch 1 ran other ops than the first batch.*'cos' where the "
                                                 r"first batch ran 'sin'"):
        statistics(Branchy(), [torch.randn(3, 2), torch.randn(2, 2)], ["exp"], progress=False)


def test_kept_sizes_that_change_between_batches_are_refused() -> None:
    with pytest.raises(InvalidOptionError, match=r"gave a value of shape \(2, 5\) in batch 1"):
        statistics(nn.Sequential(nn.ReLU()), [torch.randn(2, 4), torch.randn(2, 5)], ["0"], progress=False)


def test_ops_that_differ_only_after_the_chosen_site_are_fine() -> None:
    class Tail(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.exp(x)
            return torch.sin(x) if x.shape[0] > 2 else torch.cos(x)

    batches = [torch.randn(3, 2), torch.randn(2, 2)]
    found = _collect(Tail(), batches, ["exp"])
    assert [torch.equal(v, b.exp()) for (_, v), b in zip(found["exp"], batches)] == [True, True]


def test_an_input_is_taken_from_the_call_and_a_buffer_from_a_logged_pass_of_each_batch() -> None:
    from tests.models import WithBuffers
    from torchlog.history import all_passes

    torch.manual_seed(5)
    model, calls = WithBuffers(), []
    model.register_forward_pre_hook(lambda m, a: calls.append(1))
    batches = [torch.randn(2, 4) for _ in range(3)]
    found = _collect(model, batches, [0, "buffer"])
    assert len(calls) == 3  # one call per batch, each logged for the buffers
    assert [torch.equal(v, b) for (_, v), b in zip(found[0], batches)] == [True] * 3
    for index, batch in enumerate(batches):  # the oracle: each batch's own logged pass
        history = torchlog.log_forward_pass(model, batch, layers_to_save=["buffer"])
        expected = [p.tensor_contents for p in all_passes(history) if p.tensor_contents is not None]
        values = [v for i, v in found["buffer"] if i == index]
        assert len(values) == len(expected) >= 2
        assert all(torch.equal(v, e) for v, e in zip(values, expected))


def test_a_pass_with_only_an_input_site_still_ends_at_stop_after() -> None:
    class RaisesAfterRelu(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = torch.relu(x)
            raise RuntimeError("ran past the stop")

    batches = [torch.randn(2, 3) for _ in range(3)]
    found = _collect(RaisesAfterRelu(), batches, [0], stop_after="relu")
    assert [torch.equal(v, b) for (_, v), b in zip(found[0], batches)] == [True] * 3
    with pytest.raises(RuntimeError, match="ran past the stop"):  # the control: without the stop
        _collect(RaisesAfterRelu(), batches, [0])
