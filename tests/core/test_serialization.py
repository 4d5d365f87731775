"""torch.save / torch.load of neuron tensors with the default ``weights_only=True``.

Checkpoints of neuron tensors, parameters, state dicts and whole modules load
under the weights-only unpickler exactly as CPU ones do: a neuron checkpoint
needs no global that the same CPU checkpoint does not need, and every
``map_location`` form restores where it says.
"""

import io

import pytest
import torch
from torch.serialization import get_unsafe_globals_in_checkpoint, safe_globals


def _saved(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def _checkpoint(device):
    # Drawn on CPU, then moved: the same values on both devices.
    torch.manual_seed(0)
    lin = torch.nn.Linear(3, 2).to(device)
    return {
        "t": torch.randn(2, 3).to(device),
        "view": torch.arange(6.0, device=device)[1:5],
        "half": torch.randn(4, dtype=torch.bfloat16).to(device),
        "p": torch.nn.Parameter(torch.randn(2).to(device)),
        "sd": lin.state_dict(),
        "step": 3,
    }


@pytest.mark.parametrize(
    "map_location, expected",
    [
        (None, "neuron:0"),
        ("cpu", "cpu"),
        ("neuron", "neuron:0"),
        ("neuron:1", "neuron:1"),
        (torch.device("neuron", 1), "neuron:1"),
        ({"neuron:0": "cpu"}, "cpu"),
        (lambda storage, location: storage, "cpu"),
    ],
)
def test_weights_only_load(map_location, expected):
    ref = _checkpoint("cpu")
    got = torch.load(_saved(_checkpoint("neuron")), map_location=map_location)  # weights_only=True by default
    assert got["step"] == 3
    assert type(got["p"]) is torch.nn.Parameter
    for key in ("t", "view", "half", "p"):
        assert str(got[key].device) == expected
        assert got[key].dtype == ref[key].dtype
        torch.testing.assert_close(got[key].cpu(), ref[key].detach(), rtol=0, atol=0)
    for name, value in ref["sd"].items():
        assert str(got["sd"][name].device) == expected
        torch.testing.assert_close(got["sd"][name].cpu(), value, rtol=0, atol=0)


def test_cpu_checkpoint_to_neuron():
    got = torch.load(_saved(_checkpoint("cpu")), map_location="neuron:1")
    assert got["t"].device == torch.device("neuron", 1)


def test_neuron_checkpoint_needs_no_extra_globals():
    assert get_unsafe_globals_in_checkpoint(_saved(_checkpoint("neuron"))) == []
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.GRUCell(4, 2))
    cpu_needs = get_unsafe_globals_in_checkpoint(_saved(module))
    assert cpu_needs  # whole modules need allowlisting on every device
    assert get_unsafe_globals_in_checkpoint(_saved(module.to("neuron"))) == cpu_needs


def test_whole_module_loads_like_cpu():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh())
    x = torch.randn(2, 3)
    neuron_ckpt = _saved(module.to("neuron"))
    # Not allowlisted: refused as on CPU, naming the global to allow.
    with pytest.raises(Exception, match="Weights only load failed") as info:
        torch.load(neuron_ckpt)
    assert "torch.nn.modules.container.Sequential" in str(info.value)
    neuron_ckpt.seek(0)
    with safe_globals([torch.nn.Sequential, torch.nn.Linear, torch.nn.Tanh]):
        loaded = torch.load(neuron_ckpt)
    assert next(loaded.parameters()).device == torch.device("neuron", 0)
    torch.testing.assert_close(loaded(x.to("neuron")).cpu(), module.cpu()(x), rtol=0, atol=0)
