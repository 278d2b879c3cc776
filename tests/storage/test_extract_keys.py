"""The keys extract took open what it wrote: ActivationFile, ActivationDataset and
`python -m torchlog layers` take module addresses, substrings and positions as well as labels."""
from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch import nn

import torchlog
from torchlog.__main__ import main
from torchlog.errors import LayerNotFoundError
from torchlog.storage import ActivationDataset, open_activations


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.act, self.fc2 = nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 3)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


DATA = torch.randn(40, 6, generator=torch.Generator().manual_seed(1))


def _module_outputs(model: nn.Module, addresses: list[str]) -> dict[str, torch.Tensor]:
    """The oracle: what forward hooks see each module return, over DATA in one call."""
    seen: dict[str, torch.Tensor] = {}
    named = dict(model.named_modules())
    handles = [named[a].register_forward_hook(lambda m, i, out, a=a: seen.__setitem__(a, out.clone()))
               for a in addresses]
    with torch.no_grad():
        model(DATA)
    for handle in handles:
        handle.remove()
    return seen


@pytest.fixture(scope="module")
def acts_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "acts.h5"
    torchlog.extract(Net(), DATA, layers=["fc1", "act", "linear"], to=path, batch_size=16, progress=False)
    return path


def test_the_issue_reproducer_opens_fc1_by_its_address(acts_path: Path) -> None:
    expected = _module_outputs(Net(), ["fc1", "act"])
    data = ActivationDataset(acts_path, layers=["fc1"])
    assert data.layers == ["linear_1_1"] and len(data) == 40
    torch.testing.assert_close(torch.stack([data[i] for i in range(40)]), expected["fc1"])
    acts = open_activations(acts_path)
    torch.testing.assert_close(torch.from_numpy(acts["act"]), expected["act"])
    torch.testing.assert_close(acts.tensor("fc1"), expected["fc1"])
    assert "fc1" in acts and "linear_1_1" in acts


def test_an_entry_that_chose_several_layers_stands_for_all_of_them(acts_path: Path) -> None:
    expected = _module_outputs(Net(), ["fc1", "fc2"])
    acts = open_activations(acts_path)
    assert acts.selected == {"fc1": ["linear_1_1"], "act": ["relu_1_2"], "linear": ["linear_1_1", "linear_2_3"]}
    data = ActivationDataset(acts_path, layers=["linear", "act"])
    assert data.layers == ["linear_1_1", "linear_2_3", "relu_1_2"]
    first, second, _ = data[7]
    torch.testing.assert_close(first, expected["fc1"][7])
    torch.testing.assert_close(second, expected["fc2"][7])
    assert "linear" not in acts  # `acts[key]` is one array: the key must name one layer
    with pytest.raises(LayerNotFoundError, match=r"'linear' selected 2 layers of .* \(linear_1_1, "
                       r"linear_2_3\); read one of them by label, or all with ActivationDataset"):
        acts["linear"]


def test_an_unknown_key_lists_the_labels_and_the_entries(acts_path: Path) -> None:
    message = (r"no layer 'fc3' in '.*acts.h5'; it holds 3 layers \(linear_1_1, relu_1_2, linear_2_3\), "
               r"chosen by the entries extract took: 'fc1' \(1 layer\), 'act' \(1 layer\), 'linear' "
               r"\(2 layers\); name a layer by its label or by one of those entries; closest: fc1")
    with pytest.raises(LayerNotFoundError, match=message):
        ActivationDataset(acts_path, layers=["fc3"])
    with pytest.raises(LayerNotFoundError, match=message):
        open_activations(acts_path)["fc3"]


def test_a_position_entry_opens_the_layer_it_chose(tmp_path: Path) -> None:
    path = tmp_path / "acts.h5"
    acts = torchlog.extract(Net(), DATA, layers=[-2], to=path, batch_size=16, progress=False)
    chosen = torchlog.log_forward_pass(Net(), DATA[:16], layers_to_save=None)[-2].label
    assert acts.labels_for(-2) == [chosen] and chosen == "linear_2_3"
    torch.testing.assert_close(ActivationDataset(path, layers=[-2])[3], _module_outputs(Net(), ["fc2"])["fc2"][3])
    with pytest.raises(LayerNotFoundError, match="no layer -3 in"):
        acts.labels_for(-3)


def test_a_file_written_before_entries_were_recorded_still_opens_by_label(tmp_path: Path) -> None:
    path = tmp_path / "old.h5"
    torchlog.extract(Net(), DATA, layers=["fc1"], to=path, batch_size=16, progress=False)
    with h5py.File(path, "r+") as file:  # as files written before the `selected` attribute were
        del file["layers"].attrs["selected"]
    acts = open_activations(path)
    assert acts.selected == {} and list(acts) == ["linear_1_1"]
    np.testing.assert_array_equal(ActivationDataset(path, layers=["linear_1_1"])[0].numpy(), acts["linear_1_1"][0])
    with pytest.raises(LayerNotFoundError, match=r"no layer 'fc1' in .*; it holds 1 layers \(linear_1_1\); "
                       r"name a layer by its label$"):
        ActivationDataset(path, layers=["fc1"])


def test_the_layers_command_takes_the_same_keys(acts_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["layers", str(acts_path)]) == 0
    rows = [line.split("float32") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0].split()[0], r[1].strip()) for r in rows] == [("linear_1_1", "'fc1', 'linear'"), ("relu_1_2", "'act'"),
                                             ("linear_2_3", "'linear'")]
    assert main(["layers", str(acts_path), "fc1", "relu_1_2"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]] == ["linear_1_1", "relu_1_2"]
    assert main(["layers", str(acts_path), "fc3"]) == 1
    assert "torchlog: error: no layer 'fc3'" in capsys.readouterr().err
