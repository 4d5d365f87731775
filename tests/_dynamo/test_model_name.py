"""torch_neuronx.neuron_dynamo_backend: the real TorchNeuron's helper API names."""

import glob
import json

import pytest
import torch

import torch_neuronx._dynamo as nd


@pytest.fixture
def _no_model_name():
    yield
    nd._model_name = None


def test_set_model_name_names_graphs_metrics_and_cache_entries(tmp_path, monkeypatch, _no_model_name):
    from torch_neuronx.neuron_dynamo_backend import get_dynamo_metrics, reset_dynamo_metrics, set_model_name

    assert get_dynamo_metrics is torch.neuron.get_dynamo_metrics
    monkeypatch.setenv("TORCH_NEURONX_NEFF_CACHE_DIR", str(tmp_path))
    reset_dynamo_metrics()
    set_model_name("tiny-unet")
    x = torch.randn(4, 4)
    out = torch.compile(lambda t: torch.tanh(t) * 2, backend="neuron")(x.to("neuron"))
    torch.testing.assert_close(out.cpu(), torch.tanh(x) * 2)

    m = get_dynamo_metrics()
    assert [g["graph"] for g in m["graphs"]] == ["tiny-unet_" + m["graphs"][0]["graph"].split("_")[-1]]
    assert "tiny-unet_" in str(m)
    records = glob.glob(str(tmp_path / "*" / "neuron_index" / "**" / "*.json"), recursive=True)
    assert records and all(json.load(open(r))["model"] == "tiny-unet" for r in records)

    # options={"model_name": ...} of one torch.compile call wins over set_model_name
    torch.compile(lambda t: t - 1, backend="neuron", options={"model_name": "explicit"})(x.to("neuron"))
    assert get_dynamo_metrics()["graphs"][-1]["graph"].startswith("explicit_")


@pytest.mark.parametrize("bad", ["", "  ", None, 3])
def test_set_model_name_rejects_non_names(bad, _no_model_name):
    from torch_neuronx.neuron_dynamo_backend import set_model_name

    with pytest.raises(ValueError, match="non-empty str"):
        set_model_name(bad)
