"""Text-to-image with Diffusers on the `neuron` device: eager, compiled, tensor parallel.

Pipelines are built from small local configs (`diffusion_pipelines.py`, no Hub):
Stable Diffusion (UNet), FLUX.1, FLUX.2 [klein], Qwen-Image and Qwen-Image-2.1.

    # one pipeline on one NeuronCore, eager, checked against CPU, PNG saved
    python examples/diffusion.py --pipeline flux --check-cpu
    # regional compilation of the transformer blocks (SD: --compile full compiles the UNet)
    python examples/diffusion.py --pipeline qwenimage --compile regional --check-cpu
    # every pipeline, eager and compiled
    python examples/diffusion.py --pipeline all --compile both --check-cpu
    # tensor parallel over 4 logical cores (one trn2 chip at LNC=2), checked against one core
    NEURON_LOGICAL_NC_CONFIG=2 torchrun --standalone --nproc_per_node=4 examples/diffusion.py \
        --pipeline flux --tp --compile regional --check-single
    # TP=8 needs eight logical cores: two trn2 chips at LNC=2
    TORCH_NEURONX_INSTANCE_TYPE=trn2.48xlarge NEURON_LOGICAL_NC_CONFIG=2 \
        torchrun --standalone --nproc_per_node=8 examples/diffusion.py --pipeline flux2 --tp

Exits non-zero when a check fails. Images go to `--out` (default `diffusion_out/`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from diffusion_pipelines import PIPELINES, TP_PIPELINES, add_unet_tp_plan, build_pipeline, denoiser  # noqa: E402

PROMPT = "a photo of a red fox in the snow"


def compile_denoiser(pipe, mode: str) -> None:
    """Compile the denoiser for backend "neuron" with static shapes.

    `regional`: diffusers' `compile_repeated_blocks` (each transformer block class is
    compiled once and reused); `full`: the whole denoiser in one graph.
    """
    model = denoiser(pipe)
    if mode == "regional":
        model.compile_repeated_blocks(backend="neuron", dynamic=False, fullgraph=True)
    elif mode == "full":
        model.compile(backend="neuron", dynamic=False, fullgraph=True)
    elif mode != "none":
        raise ValueError(f"unknown compile mode {mode!r}")


def generate(pipe, call_kwargs: dict, steps: int, seed: int, prompt: str = PROMPT) -> np.ndarray:
    """Run the pipeline once; returns the image as float32 HWC array in [0, 1].

    The generator is a CPU one, as diffusers samples latents on CPU for neuron anyway,
    so every device and every rank starts from the same noise.
    """
    generator = torch.Generator("cpu").manual_seed(seed)
    out = pipe(prompt=prompt, num_inference_steps=steps, generator=generator, output_type="np", **call_kwargs)
    return out.images[0]


def save_png(image: np.ndarray, path: Path) -> None:
    from diffusers.utils import numpy_to_pil

    path.parent.mkdir(parents=True, exist_ok=True)
    numpy_to_pil(image[None])[0].save(path)


def compare(name: str, image: np.ndarray, reference: np.ndarray, atol: float) -> bool:
    if image.shape != reference.shape:
        print(f"[{name}] shape {image.shape} != reference {reference.shape} -> MISMATCH", flush=True)
        return False
    diff = float(np.abs(image.astype(np.float64) - reference).max())
    ok = diff <= atol
    print(f"[{name}] max |diff| = {diff:.3g} (atol {atol:g}) -> {'OK' if ok else 'MISMATCH'}", flush=True)
    return ok


def _modes(arg: str, pipeline: str) -> list[str]:
    if arg == "both":
        return ["none", "full" if pipeline == "sd" else "regional"]
    return [arg]


def run_single(args) -> bool:
    """Each pipeline on one NeuronCore (or CPU), optionally against CPU eager."""
    ok = True
    names = PIPELINES if args.pipeline == "all" else [args.pipeline]
    device = torch.device(args.device)
    for name in names:
        pipe, kwargs = build_pipeline(name, args.size, seed=args.seed)
        reference = generate(pipe, kwargs, args.steps, args.seed) if args.check_cpu else None
        pipe.to(device)
        for mode in _modes(args.compile, name):
            if mode != "none":
                compile_denoiser(pipe, mode)  # in place, after the eager run (modes run eager first)
            start = time.perf_counter()
            image = generate(pipe, kwargs, args.steps, args.seed)
            label = f"{name} {device.type} {'eager' if mode == 'none' else 'compiled-' + mode}"
            print(f"[{label}] {args.steps} steps in {time.perf_counter() - start:.2f} s", flush=True)
            path = Path(args.out) / f"{name}_{device.type}_{mode}.png"
            save_png(image, path)
            print(f"[{label}] saved {path}", flush=True)
            if reference is not None:
                ok &= compare(f"{label} vs cpu", image, reference, args.atol)
    return ok


def run_tensor_parallel(args) -> bool:
    """Under torchrun: shard the transformer over all ranks with diffusers' `enable_parallelism`."""
    import torch.distributed as dist
    from diffusers import TensorParallelConfig

    if "LOCAL_RANK" not in os.environ:
        raise SystemExit("--tp runs under torchrun, e.g. torchrun --standalone --nproc_per_node=2 ...")
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if world > torch.neuron.device_count():
        raise SystemExit(
            f"TP={world} needs {world} logical NeuronCores but this instance has {torch.neuron.device_count()} "
            f"visible (set by TORCH_NEURONX_INSTANCE_TYPE, NEURON_LOGICAL_NC_CONFIG, NEURON_RT_VISIBLE_CORES and "
            f"NEURON_RT_NUM_CORES); e.g. unset NEURON_RT_NUM_CORES or set NEURON_RT_NUM_CORES={world}, and for TP=8 "
            f"at LNC=2 use TORCH_NEURONX_INSTANCE_TYPE=trn2.48xlarge"
        )
    dist.init_process_group("neuron")
    rank = dist.get_rank()
    device = torch.device("neuron", local_rank)
    ok = True
    try:
        # Single-core reference first, on rank 0's core, from an identically seeded build.
        reference = None
        if args.check_single and rank == 0:
            ref_pipe, kwargs = build_pipeline(args.pipeline, args.size, seed=args.seed)
            ref_pipe.set_progress_bar_config(disable=True)
            reference = generate(ref_pipe.to(device), kwargs, args.steps, args.seed)
            del ref_pipe

        pipe, kwargs = build_pipeline(args.pipeline, args.size, seed=args.seed)
        pipe.set_progress_bar_config(disable=rank != 0)
        model = denoiser(pipe)
        if args.pipeline not in TP_PIPELINES:
            # No `_tp_plan` in diffusers for the UNet: add one (see add_unet_tp_plan, the README guide).
            add_unet_tp_plan(model)
        # The neuron TP path slices each planned weight on CPU, so shard before moving to the device.
        model.enable_parallelism(config=TensorParallelConfig(tp_degree=world))
        pipe.to(device)
        for mode in _modes(args.compile, args.pipeline):
            if mode != "none":
                compile_denoiser(pipe, mode)
            start = time.perf_counter()
            image = generate(pipe, kwargs, args.steps, args.seed)
            label = f"{args.pipeline} TP={world} {'eager' if mode == 'none' else 'compiled-' + mode}"
            if rank == 0:
                print(f"[{label}] {args.steps} steps in {time.perf_counter() - start:.2f} s", flush=True)
                path = Path(args.out) / f"{args.pipeline}_tp{world}_{mode}.png"
                save_png(image, path)
                print(f"[{label}] saved {path}", flush=True)
                if reference is not None:
                    ok &= compare(f"{label} vs 1 core", image, reference, args.atol)
        flag = torch.tensor([1 if ok else 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())
    finally:
        dist.destroy_process_group()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="flux", choices=(*PIPELINES, "all"))
    parser.add_argument("--device", default="neuron", help="neuron (default) or cpu")
    parser.add_argument("--compile", default="none", choices=("none", "regional", "full", "both"))
    parser.add_argument("--size", default="tiny", choices=("tiny", "bench"))
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="diffusion_out")
    parser.add_argument("--check-cpu", action="store_true", help="compare each image with CPU eager")
    parser.add_argument("--tp", action="store_true", help="tensor parallel over all torchrun ranks")
    parser.add_argument("--check-single", action="store_true", help="(--tp) compare with a one-core run")
    parser.add_argument("--atol", type=float, default=1e-2, help="max abs difference of pixels in [0, 1]")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    ok = run_tensor_parallel(args) if args.tp else run_single(args)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
