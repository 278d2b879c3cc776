"""extract(..., stop_after=site) ends every batch at the site: the layers before it are saved as
a plain hooked loop saves them, and nothing after it runs (the first batch is logged, the later
ones run lean, and each stops at the same place)."""
from __future__ import annotations

import h5py
import pytest
import torch
from torch import nn

import torchlog
from torchlog import select
from torchlog.errors import InvalidArgumentTypeError, InvalidOptionError, LogFileExistsError

NUM_SAMPLES, BATCH = 20, 4


class Tail(nn.Module):
    """The part of the model after the stop: counts its calls, and can refuse to run."""

    def __init__(self, raises: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 3)
        self.raises, self.calls = raises, 0

    def forward(self, x):
        self.calls += 1
        if self.raises:
            raise RuntimeError("the tail ran")
        return self.fc(x)


class Net(nn.Module):
    def __init__(self, raises: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.act, self.fc2 = nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 8)
        self.tail = Tail(raises)

    def forward(self, x):
        h = self.act(self.fc1(x))
        return self.tail(torch.tanh(self.fc2(h)))


def _data() -> torch.Tensor:
    return torch.randn(NUM_SAMPLES, 6, generator=torch.Generator().manual_seed(3))


def _hooked(names: list[str]) -> dict[str, torch.Tensor]:
    """The oracle: a plain no_grad loop over the batches, forward hooks copying the outputs."""
    model = Net()
    rows: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    for name in names:
        model.get_submodule(name).register_forward_hook(lambda m, i, out, name=name: rows[name].append(out.clone()))
    with torch.no_grad():
        for batch in _data().split(BATCH):
            model(batch)
    return {name: torch.cat(values) for name, values in rows.items()}


@pytest.mark.parametrize("stop", ["fc2:1", "act:1"])
def test_layers_before_the_stop_equal_a_hooked_loop_and_the_tail_never_runs(tmp_path, stop) -> None:
    model = Net(raises=True)
    layers = ["fc1", "act"] if stop == "act:1" else ["fc1", "act", "fc2"]
    acts = torchlog.extract(model, _data(), layers, str(tmp_path / "a.h5"), batch_size=BATCH, stop_after=stop)
    oracle = _hooked(layers)
    for name in layers:
        torch.testing.assert_close(acts.tensor(name), oracle[name])
    assert model.tail.calls == 0


@pytest.mark.parametrize("stop, tail_calls", [("fc2", 0), (select.func("tanh"), 1)], ids=["address", "selector"])
def test_a_stop_found_by_a_probe_runs_the_tail_once_on_the_first_batch_only(tmp_path, stop, tail_calls) -> None:
    """A selector names its last pass, which one logged pass of the first batch finds
    (log_forward_pass's probe): that pass runs the whole model once; the other batches
    stop. A module address without call number names its first call, decided while each
    pass runs: the tail never runs."""
    model = Net()
    acts = torchlog.extract(model, _data(), ["fc1", "fc2"], str(tmp_path / "a.h5"), batch_size=BATCH,
                            stop_after=stop)
    oracle = _hooked(["fc1", "fc2"])
    for name in ("fc1", "fc2"):
        torch.testing.assert_close(acts.tensor(name), oracle[name])
    assert model.tail.calls == tail_calls


def test_without_stop_the_tail_runs_and_raises(tmp_path) -> None:
    """The control for the test above: the same model, the same layers, no stop."""
    with pytest.raises(RuntimeError, match="the tail ran"):
        torchlog.extract(Net(raises=True), _data(), ["fc1"], str(tmp_path / "a.h5"), batch_size=BATCH)


def test_each_later_batch_stops_too(tmp_path) -> None:
    model = Net()
    torchlog.extract(model, _data(), ["fc1"], str(tmp_path / "a.h5"), batch_size=BATCH, stop_after="fc2:1")
    assert model.tail.calls == 0
    torchlog.extract(model, _data(), ["fc1"], str(tmp_path / "b.h5"), batch_size=BATCH)
    assert model.tail.calls == NUM_SAMPLES // BATCH


def test_a_layer_after_the_stop_is_refused_naming_both_and_no_file_is_written(tmp_path) -> None:
    path = tmp_path / "a.h5"
    with pytest.raises(InvalidOptionError, match=r"tail.*stop_after='fc2:1'.*move stop_after past 'tail'"):
        torchlog.extract(Net(), _data(), ["fc1", "tail"], str(path), batch_size=BATCH, stop_after="fc2:1")
    assert not path.exists()


def test_a_stop_that_matches_nothing_and_a_bad_type_are_refused(tmp_path) -> None:
    with pytest.raises(InvalidArgumentTypeError, match=r"stop_after site 1\.5 of type float"):
        torchlog.extract(Net(), _data(), ["fc1"], str(tmp_path / "a.h5"), batch_size=BATCH, stop_after=1.5)
    with pytest.raises(torchlog.InterventionError, match="no_such_module"):
        torchlog.extract(Net(), _data(), ["fc1"], str(tmp_path / "b.h5"), batch_size=BATCH,
                         stop_after="no_such_module")
    assert not (tmp_path / "a.h5").exists() and not (tmp_path / "b.h5").exists()


def test_the_file_records_the_stop_and_a_rerun_with_another_stop_is_refused(tmp_path) -> None:
    path = str(tmp_path / "a.h5")
    torchlog.extract(Net(), _data(), ["fc1"], path, batch_size=BATCH, stop_after="fc2:1")
    with h5py.File(path, "r") as file:
        assert file.attrs["stop_after"] == '"fc2:1"'
    with pytest.raises(LogFileExistsError, match="stop_after"):
        torchlog.extract(Net(), _data(), ["fc1"], path, batch_size=BATCH, stop_after="act:1")
    with pytest.raises(LogFileExistsError, match="stop_after"):
        torchlog.extract(Net(), _data(), ["fc1"], path, batch_size=BATCH)
