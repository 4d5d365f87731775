"""Kernelize a transformers ViT with an NKI MLP kernel from a local Hugging Face kernel repo.

    PYTHONPATH=. HF_HUB_OFFLINE=1 python examples/nki/vit_kernelize.py

1. Builds a tiny ViT (random weights, local config) on the ``neuron`` device.
2. Loads ``examples/nki/kernel_repo`` (variant ``build/torch-neuron``) with the
   ``kernels`` library and swaps every ``ViTMLP`` (fc1, GELU, fc2) for the
   repository's fused NKI MLP kernel: ``kernels.kernelize(model, device="neuron")``.
3. Checks the kernelized model's output against the original one.
4. Prints the cost model's estimated trn2 time of the kernel and of the unfused
   PyTorch ops it replaces (linear, gelu, linear), for the tiny model's MLP
   (float32, as run) and for a ViT-Base-sized MLP (197 tokens, 768 -> 3072 -> 768,
   bfloat16 as ViT inference runs on Trainium).

ViT has no hub-registered layers, so the repository ships a layout class
(``NKIViTMLPLayout``) that transformers' own class-replacement registry
(``transformers.monkey_patching.register_patch_mapping``) uses for ``ViTMLP``
while the model is built; that is the registry transformers fills itself when
a model is loaded with a ``KernelConfig``.
"""

import argparse
from pathlib import Path

import torch
import torch.nn.functional as F
from kernels import LocalLayerRepository, Mode, get_local_kernel, kernelize, use_kernel_mapping
from transformers import ViTConfig, ViTModel
from transformers.monkey_patching import apply_patches, register_patch_mapping, unregister_patch_mapping

from torch_neuronx import nki

REPO = Path(__file__).resolve().parent / "kernel_repo"
TOLERANCE = 1e-4  # float32: kernel and PyTorch differ only in summation order


def unfused_mlp(x, w1, b1, w2, b2):
    """What ViTMLP runs without the kernel: three separate ops through HBM."""
    return F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2)


def build_vit(args, layout_cls):
    config = ViTConfig(
        image_size=args.image_size,
        patch_size=args.patch_size,
        hidden_size=args.hidden_size,
        intermediate_size=4 * args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_channels=3,
    )
    register_patch_mapping({"ViTMLP": layout_cls}, overwrite=True)
    try:
        torch.manual_seed(0)
        with apply_patches():
            model = ViTModel(config, add_pooling_layer=False)
    finally:
        unregister_patch_mapping(["ViTMLP"])
    return model.to("neuron").eval()


def estimate(title, tokens, hidden, generator, dtype=torch.float32):
    """Cost-model comparison of the NKI MLP kernel and the unfused ops on one NeuronCore of trn2."""
    kernel = get_local_kernel(REPO).mlp_kernel
    inter = 4 * hidden
    args = (
        torch.randn(tokens, hidden, generator=generator),
        torch.randn(inter, hidden, generator=generator) / hidden**0.5,
        torch.randn(inter, generator=generator),
        torch.randn(hidden, inter, generator=generator) / inter**0.5,
        torch.randn(hidden, generator=generator),
    )
    cmp = nki.compare(kernel, unfused_mlp, *(a.to(dtype) for a in args), platform_target="trn2")
    err = (cmp.kernel_output.float() - cmp.torch_output.float()).abs().max().item()
    print(f"{title}: x[{tokens}, {hidden}] -> {inter} -> {hidden}, {str(dtype).removeprefix('torch.')}")
    print(
        f"  NKI fused MLP kernel   {cmp.kernel.total_time_us:9.2f} us  ({cmp.kernel.bound}-bound, "
        f"HBM {cmp.kernel.hbm_bytes / 1e6:.2f} MB)"
    )
    print(
        f"  unfused PyTorch ops    {cmp.torch.total_time_us:9.2f} us  ({cmp.torch.bound}-bound, "
        f"HBM {cmp.torch.hbm_bytes / 1e6:.2f} MB)"
    )
    print(f"  estimated speedup on trn2: {cmp.speedup:.2f}x   (max |kernel - torch| = {err:.1e})")
    return cmp.speedup


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--patch-size", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--skip-base", action="store_true", help="skip the ViT-Base-sized estimate")
    args = parser.parse_args()

    repo = get_local_kernel(REPO)
    model = build_vit(args, repo.layers.NKIViTMLPLayout)
    pixels = torch.randn(args.batch, 3, args.image_size, args.image_size, device="neuron")
    with torch.no_grad():
        reference = model(pixels).last_hidden_state

    mapping = {"NKIViTMLP": {"neuron": LocalLayerRepository(repo_path=REPO, layer_name="NKIViTMLP")}}
    with use_kernel_mapping(mapping, inherit_mapping=False):
        kernelize(model, device="neuron", mode=Mode.INFERENCE)
    swapped = sum(
        type(m).__name__ == "NKIViTMLPLayout" and m.forward.__func__.__qualname__ == "NKIViTMLP.forward"
        for m in model.modules()
    )
    with torch.no_grad():
        out = model(pixels).last_hidden_state
    diff = (out - reference).abs().max().item()
    print(f"kernelized {swapped} ViTMLP blocks with {REPO.name}:NKIViTMLP (variant torch-neuron)")
    print(
        f"output {tuple(out.shape)} on {out.device}: max |kernelized - original| = {diff:.2e} "
        f"(tolerance {TOLERANCE:g})"
    )
    if swapped != args.layers or not diff <= TOLERANCE:
        raise SystemExit("kernelized ViT does not match the original model")

    generator = torch.Generator().manual_seed(0)
    tokens = args.batch * ((args.image_size // args.patch_size) ** 2 + 1)
    estimate("tiny ViT MLP (this model)", tokens, args.hidden_size, generator)
    if not args.skip_base:
        estimate("ViT-Base MLP, batch 1", 197, 768, generator, dtype=torch.bfloat16)


if __name__ == "__main__":
    main()
