"""Every causal-LM architecture of transformers' auto mapping, built from a tiny
config (torch_neuronx.tools.arch_coverage): greedy generation on neuron eager must
give CPU's tokens and logits; static cache with the decode step compiled by
backend "neuron" is checked on a representative set (fast) and more (slow).
Architectures that fail on CPU itself are skipped with CPU's error."""

import pytest
import torch

from torch_neuronx.tools import arch_coverage as ac

# Static cache + compiled decode: each architecture costs one Inductor compile.
COMPILED_FAST = ["llama", "gpt2"]
COMPILED_SLOW = [
    "mistral",
    "qwen2",
    "qwen3",
    "gemma2",
    "gemma3_text",
    "phi3",
    "gpt_neox",
    "falcon",
    "mixtral",
    "qwen3_moe",
    "olmo2",
]


@pytest.fixture(autouse=True, scope="module")
def _quiet_transformers_private_cache(tmp_path_factory):
    import os

    import transformers

    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    old = os.environ.get("TORCH_NEURONX_NEFF_CACHE_DIR")
    os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = str(tmp_path_factory.mktemp("neff"))  # never the user's
    yield
    transformers.logging.set_verbosity(level)
    if old is None:
        os.environ.pop("TORCH_NEURONX_NEFF_CACHE_DIR", None)
    else:
        os.environ["TORCH_NEURONX_NEFF_CACHE_DIR"] = old


def _run(arch, compiled):
    try:
        return ac.run_architecture(arch, compiled=compiled)
    except ac.SkipArchitecture as e:
        pytest.skip(f"fails on CPU itself: {e}")


@pytest.mark.parametrize("arch", ac.architectures())
def test_eager_generation_matches_cpu(arch):
    r = _run(arch, compiled=False)
    assert r["error"] is None, r.get("traceback", r["error"])
    assert r["eager_equal"], f"{arch}: tokens differ from CPU"
    # exact for every dense model; MoE decode differs in the last bit because transformers
    # switches experts to "batched_mm" for decoding on any non-CPU device (generation/utils.py)
    assert r["eager_max_diff"] <= ac.EAGER_ATOL, r


def test_moe_decode_is_exact_with_cpu_s_experts_algorithm():
    """The only eager logit differences come from transformers' device-dependent MoE switch."""
    import copy

    from transformers import DynamicCache

    cfg, cpu_model = ac.build_model("qwen3_moe")
    model = copy.deepcopy(cpu_model).to("neuron")
    ids = ac._prompt(cfg)
    with torch.no_grad():
        outs = []
        for m, dev in ((cpu_model, "cpu"), (model, "neuron")):
            cache = DynamicCache(config=m.config)
            first = m(ids.to(dev), past_key_values=cache).logits
            nxt = first[:, -1:].argmax(-1)
            outs.append((first.cpu(), m(nxt, past_key_values=cache).logits.cpu()))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def _check_compiled(arch):
    r = _run(arch, compiled=True)
    assert r["eager_equal"] and r["error"] is None, r.get("traceback", r["error"])
    if r["compiled_status"].startswith("n/a"):
        pytest.skip(r["compiled_status"])
    assert r["compiled_equal"], f"{arch}: compiled tokens differ from CPU"
    assert r["compiled_max_diff"] <= ac.COMPILED_ATOL, r


@pytest.mark.slow
@pytest.mark.parametrize("arch", COMPILED_FAST)
def test_static_compiled_generation_matches_cpu(arch):
    _check_compiled(arch)


@pytest.mark.slow
@pytest.mark.parametrize("arch", COMPILED_SLOW)
def test_static_compiled_generation_matches_cpu_more(arch):
    _check_compiled(arch)


@pytest.mark.parametrize(
    "arch, reason",
    [
        ("minimax", "uses no static cache"),  # its own MiniMaxCache: generate ignores cache_implementation
        ("llama4_text", "does not compile"),  # get_compiled_call returns the eager forward for llama4
    ],
)
def test_static_decode_transformers_never_compiles_is_not_applicable(arch, reason):
    # not a failure of the device: transformers runs no compiled decode for these on any device
    r = _run(arch, compiled=True)
    assert r["eager_equal"] and r["error"] is None, r.get("traceback", r["error"])
    assert r["compiled_status"].startswith("n/a") and reason in r["compiled_status"], r


def test_tiny_config_is_tiny_and_keeps_hybrid_layer_kinds():
    cfg = ac.tiny_config("gemma3_text")
    assert cfg.hidden_size <= 64 and cfg.vocab_size <= ac.VOCAB
    assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    assert cfg.num_hidden_layers == len(cfg.layer_types)


def test_cli_rejects_unknown_architecture(capsys):
    with pytest.raises(SystemExit) as e:
        ac.main(["--only", "not_a_model"])
    assert e.value.code == 2 and "not_a_model" in capsys.readouterr().err
