"""One denoising step of the FLUX.1 transformer at 1024 x 1024, as a user writes it, on one
process or tensor-parallel over every rank of a torchrun job (diffusers' own ``_tp_plan``
for Flux: attention q/k/v and the feed-forward up-projections column-wise, the attention
and feed-forward outputs row-wise, the single blocks' packed ``proj_out`` row-wise by block).

    python benchmarks/_flux_step.py DIR                                # one core
    torchrun --nproc-per-node 8 benchmarks/_flux_step.py DIR          # TP=8

``DIR`` is a diffusers model directory (``config.json`` naming ``FluxTransformer2DModel``);
under ``torch-neuronx check --dry-run`` its weights may be absent.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(path: str, height: int = 1024, width: int = 1024, text_tokens: int = 512) -> None:
    import torch
    import torch.distributed as dist
    from diffusers import FluxTransformer2DModel, TensorParallelConfig

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    device = torch.device("neuron", int(os.environ.get("LOCAL_RANK", "0")))
    torch.neuron.set_device(device)
    kwargs = {"torch_dtype": torch.bfloat16}
    if world > 1:
        dist.init_process_group("neuron")
        kwargs["parallel_config"] = TensorParallelConfig(tp_degree=world)
    model = FluxTransformer2DModel.from_pretrained(path, **kwargs).to(device).eval()

    cfg = model.config
    image_tokens = (height // 16) * (width // 16)  # VAE /8, then 2 x 2 patches
    bf16 = dict(device=device, dtype=torch.bfloat16)
    with torch.no_grad():  # as diffusers pipelines run the transformer
        out = model(
            hidden_states=torch.randn(1, image_tokens, cfg.in_channels, **bf16),
            encoder_hidden_states=torch.randn(1, text_tokens, cfg.joint_attention_dim, **bf16),
            pooled_projections=torch.randn(1, cfg.pooled_projection_dim, **bf16),
            timestep=torch.full((1,), 0.5, **bf16),
            img_ids=torch.zeros(image_tokens, 3, **bf16),
            txt_ids=torch.zeros(text_tokens, 3, **bf16),
            guidance=torch.full((1,), 3.5, **bf16) if cfg.guidance_embeds else None,
            return_dict=False,
        )[0]
    if rank == 0:
        print("denoised latents", tuple(out.shape), out.dtype)
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
