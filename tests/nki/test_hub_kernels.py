"""Hugging Face `kernels` on neuron: a local `torch-neuron` kernel repo, kernelize, KernelConfig.

The repository is `examples/nki/kernel_repo` (NKI RMSNorm and a fused ViT MLP).
Kernelized models are compared with the same model un-kernelized (float32;
the kernels accumulate in float32 like PyTorch, differences are rounding only).
"""

from pathlib import Path

import pytest
import torch
import torch._dynamo
from kernels import (
    LocalLayerRepository,
    Mode,
    get_local_kernel,
    kernelize,
    use_kernel_forward_from_hub,
    use_kernel_mapping,
)
from kernels.variants import get_variants_local, resolve_variant
from transformers import KernelConfig, LlamaConfig, LlamaForCausalLM, ViTConfig, ViTModel
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.monkey_patching import apply_patches, register_patch_mapping, unregister_patch_mapping
from transformers.utils.import_utils import is_kernels_available

REPO = Path(__file__).resolve().parents[2] / "examples" / "nki" / "kernel_repo"
DEV = "neuron"
TOL = 2e-5  # float32, kernel vs PyTorch: same math, different summation order


@use_kernel_forward_from_hub("RMSNorm")
class HubLlamaRMSNorm(LlamaRMSNorm):
    """LlamaRMSNorm made kernelizable under the hub name transformers gives it ("RMSNorm")."""


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # compiled graphs: private cache (tests/conftest.py)


@pytest.fixture
def patched(request):
    """Register transformers class replacements for the duration of one test."""
    registered = []

    def register(mapping):
        register_patch_mapping(mapping, overwrite=True)
        registered.extend(mapping)

    yield register
    unregister_patch_mapping(registered)


def _tiny_llama(patched):
    patched({"LlamaRMSNorm": HubLlamaRMSNorm})
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    with apply_patches():
        model = LlamaForCausalLM(cfg)
    assert isinstance(model.model.norm, HubLlamaRMSNorm)
    return model.to(DEV)


def _tiny_vit(patched):
    kernel = get_local_kernel(REPO)
    patched({"ViTMLP": kernel.layers.NKIViTMLPLayout})
    cfg = ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=256,
        num_channels=3,
    )
    torch.manual_seed(0)
    with apply_patches():
        model = ViTModel(cfg, add_pooling_layer=False)
    return model.to(DEV).eval()


def _rmsnorm_mapping():
    return {"RMSNorm": {DEV: LocalLayerRepository(repo_path=REPO, layer_name="RMSNorm")}}


def _close(a, b, tol=TOL):
    torch.testing.assert_close(a.detach().cpu(), b.detach().cpu(), rtol=tol, atol=tol)


def test_local_repo_resolves_torch_neuron_variant():
    variant, _ = resolve_variant(get_variants_local(REPO / "build"))
    assert variant is not None and variant.variant_str == "torch-neuron"
    kernel = get_local_kernel(REPO)
    assert {"RMSNorm", "NKIViTMLP", "NKIViTMLPLayout"} <= set(dir(kernel.layers))
    x, w = torch.randn(3, 5, 64, device=DEV), torch.randn(64, device=DEV)
    ref = x.cpu() * torch.rsqrt(x.cpu().pow(2).mean(-1, keepdim=True) + 1e-6) * w.cpu()
    _close(kernel.rms_norm(x, w, 1e-6), ref)
    # Fused MLP at tile boundaries (rows 15, 130 and 600 > one 512-row block; features
    # 300 = 2 x 128 + 44), with gradients.
    F = torch.nn.functional
    for rows in (15, 130, 600):
        params = [torch.randn(300, 64) / 8, torch.randn(300), torch.randn(64, 300) / 16, torch.randn(64)]
        xs = torch.randn(rows, 64, requires_grad=True)
        ref_params = [p.clone().requires_grad_() for p in params]
        w1, b1, w2, b2 = ref_params
        ref = F.linear(F.gelu(F.linear(xs, w1, b1)), w2, b2)
        ref.sum().backward()
        xn = xs.detach().to(DEV).requires_grad_()
        dev_params = [p.to(DEV).requires_grad_() for p in params]
        out = kernel.mlp(xn, *dev_params)
        out.sum().backward()
        _close(out, ref, tol=1e-4)
        for got, want in zip([xn, *dev_params], [xs, *ref_params]):
            _close(got.grad, want.grad, tol=1e-4)


def test_kernelize_llama_rmsnorm_inference(patched):
    model = _tiny_llama(patched).eval()
    ids = torch.randint(0, 96, (2, 11), device=DEV)
    with torch.no_grad():
        expected = model(ids).logits
    with use_kernel_mapping(_rmsnorm_mapping(), inherit_mapping=False):
        kernelize(model, device="neuron", mode=Mode.INFERENCE)
    norm_forward = model.model.norm.forward
    assert norm_forward.__func__.__qualname__ == "RMSNorm.forward"
    assert norm_forward.__func__.__module__.endswith(".layers")
    with torch.no_grad():
        _close(model(ids).logits, expected)


def test_kernelize_llama_rmsnorm_training_gradients(patched):
    model = _tiny_llama(patched).train()
    ids = torch.randint(0, 96, (2, 9), device=DEV)
    model(input_ids=ids, labels=ids).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    with use_kernel_mapping(_rmsnorm_mapping(), inherit_mapping=False):
        kernelize(model, device="neuron", mode=Mode.TRAINING)
    assert model.model.layers[0].input_layernorm.forward.__func__.__qualname__ == "RMSNorm.forward"
    model(input_ids=ids, labels=ids).loss.backward()
    for name, param in model.named_parameters():
        _close(param.grad, expected[name], tol=1e-4)


def test_transformers_kernel_config_local_mapping(patched):
    # transformers' own KernelConfig machinery builds the LocalLayerRepository mapping;
    # the last step is what transformers.integrations.hub_kernels.kernelize does.
    model = _tiny_llama(patched).eval()
    ids = torch.randint(0, 96, (1, 7), device=DEV)
    with torch.no_grad():
        expected = model(ids).logits
    config = KernelConfig({"RMSNorm": {"neuron": f"{REPO}:RMSNorm"}}, use_local_kernel=True)
    config.sanitize_kernel_mapping(model)
    config.create_compatible_mapping(model)
    repo = config.kernel_mapping["RMSNorm"]["neuron"][Mode.INFERENCE]
    assert isinstance(repo, LocalLayerRepository)
    with use_kernel_mapping(config.kernel_mapping, inherit_mapping=False):
        kernelize(model, device="neuron", mode=Mode.INFERENCE)
    assert model.model.norm.forward.__func__.__qualname__ == "RMSNorm.forward"
    with torch.no_grad():
        _close(model(ids).logits, expected)


@pytest.mark.skipif(
    not is_kernels_available(), reason="transformers 5.23 enables kernels only for kernels>=0.18.2 (0.17.2 installed)"
)
def test_from_pretrained_use_kernels_with_local_kernel_config(tmp_path):
    cfg = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path)
    ids = torch.randint(0, 96, (1, 7))
    plain = LlamaForCausalLM.from_pretrained(tmp_path, device_map=DEV).eval()
    config = KernelConfig({"RMSNorm": {"neuron": f"{REPO}:RMSNorm"}}, use_local_kernel=True)
    model = LlamaForCausalLM.from_pretrained(tmp_path, device_map=DEV, use_kernels=True, kernel_config=config).eval()
    assert model.model.norm.forward.__func__.__qualname__ == "RMSNorm.forward"
    with torch.no_grad():
        _close(model(ids.to(DEV)).logits, plain(ids.to(DEV)).logits)


def test_kernelize_vit_mlp_eager_and_compiled(patched):
    model = _tiny_vit(patched)
    pixels = torch.randn(2, 3, 32, 32, device=DEV)
    with torch.no_grad():
        expected = model(pixels).last_hidden_state
    mapping = {"NKIViTMLP": {DEV: LocalLayerRepository(repo_path=REPO, layer_name="NKIViTMLP")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, device="neuron", mode=Mode.INFERENCE | Mode.TORCH_COMPILE)
    assert model.layers[1].mlp.forward.__func__.__qualname__ == "NKIViTMLP.forward"
    with torch.no_grad():
        _close(model(pixels).last_hidden_state, expected, tol=1e-4)
        compiled = torch.compile(model, backend="neuron", fullgraph=True)
        _close(compiled(pixels).last_hidden_state, expected, tol=1e-4)
