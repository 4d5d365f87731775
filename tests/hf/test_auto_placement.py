"""Hugging Face placement on neuron: ``from_pretrained(device_map="auto", max_memory=...)`` balanced over
the NeuronCores within max_memory, and ``pipeline(...)`` on neuron, each equal to CPU.

transformers/accelerate pick the accelerator for ``device_map="auto"`` without max_memory and for
``pipeline()`` without a device from fixed device lists that do not include neuron; the last two tests
pin that behaviour, which docs/huggingface.md documents together with the calls used here.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, pipeline


def neuron_max_memory():
    # the call docs/huggingface.md gives: every visible NeuronCore with its free HBM
    return {i: torch.neuron.mem_get_info(i)[0] for i in range(torch.neuron.device_count())}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    path = tmp_path_factory.mktemp("placement") / "tiny"
    LlamaForCausalLM(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory):
    from torch_neuronx.demo.hf import build_base_checkpoint

    return build_base_checkpoint(str(tmp_path_factory.mktemp("placement") / "tiny-llama"))


def _placed_bytes(model):
    placed = {}
    for p in model.parameters():
        placed[p.device] = placed.get(p.device, 0) + p.numel() * p.element_size()
    return placed


def _cpu_logits(path, ids):
    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(path)(ids).logits


def test_device_map_auto_with_neuron_max_memory_balances_over_cores(checkpoint):
    model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map="auto", max_memory=neuron_max_memory())
    cores = set(model.hf_device_map.values())
    assert len(cores) >= 2 and cores <= set(range(torch.neuron.device_count())), model.hf_device_map
    assert {d.type for d in _placed_bytes(model)} == {"neuron"}
    assert {d.index for d in _placed_bytes(model)} == cores
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        logits = model(ids.to("neuron")).logits
    torch.testing.assert_close(logits.cpu(), _cpu_logits(checkpoint, ids), rtol=1e-5, atol=1e-5)


def test_device_map_auto_honours_max_memory(checkpoint):
    total = sum(_placed_bytes(AutoModelForCausalLM.from_pretrained(checkpoint)).values())
    limit = int(total * 0.6)  # two cores or more are needed; core 3 is not offered
    max_memory = {0: limit, 1: limit, 2: limit}
    model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map="auto", max_memory=max_memory)
    placed = _placed_bytes(model)
    assert all(d.type == "neuron" for d in placed), placed
    assert 3 not in {d.index for d in placed} and len(placed) >= 2, placed
    for device, nbytes in placed.items():
        assert nbytes <= max_memory[device.index], (device, nbytes, limit)


def _generate(pipe):
    return pipe("The model reads", max_new_tokens=8, do_sample=False)[0]["generated_text"]


def test_pipeline_with_device_neuron_matches_cpu(text_checkpoint):
    pipe = pipeline("text-generation", model=text_checkpoint, device="neuron")
    assert pipe.device == torch.device("neuron") and pipe.model.device.type == "neuron"
    expected = _generate(pipeline("text-generation", model=text_checkpoint, device="cpu"))
    assert _generate(pipe) == expected


def test_pipeline_over_cores_with_device_map_auto_matches_cpu(text_checkpoint):
    pipe = pipeline(
        "text-generation", model=text_checkpoint, device_map="auto", model_kwargs={"max_memory": neuron_max_memory()}
    )
    devices = {p.device for p in pipe.model.parameters()}
    assert len(devices) >= 2 and {d.type for d in devices} == {"neuron"}, devices
    expected = _generate(pipeline("text-generation", model=text_checkpoint, device="cpu"))
    assert _generate(pipe) == expected


def test_library_defaults_still_pick_cpu(checkpoint, text_checkpoint):
    # If this fails, transformers/accelerate learned about neuron: update docs/huggingface.md.
    model = AutoModelForCausalLM.from_pretrained(checkpoint, device_map="auto")
    assert {d.type for d in _placed_bytes(model)} == {"cpu"}
    assert pipeline("text-generation", model=text_checkpoint).device == torch.device("cpu")
