"""torchrun worker: Diffusers tensor parallelism on neuron vs a one-core run.

    torchrun --nproc_per_node=N diffusion_tp_worker.py PIPELINES MODE STEPS

PIPELINES is comma-separated; MODE is eager, regional or full. For each pipeline,
rank 0 first renders a reference image on its own core with an unsharded, identically
seeded build; then every rank shards the denoiser with
`enable_parallelism(TensorParallelConfig(tp_degree=N))` (the SD UNet gets the README's
`add_unet_tp_plan`), optionally compiles it, and renders again. Checks: every planned
weight is a DTensor whose local shard is 1/N of the full one along its planned dim, on
this rank's core; rank 0's image equals the reference within 5e-3. Prints RESULT lines.
"""

import os
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "examples"))
from diffusion import compile_denoiser, generate  # noqa: E402
from diffusion_pipelines import TP_PIPELINES, add_unet_tp_plan, build_pipeline, denoiser  # noqa: E402

ATOL = 5e-3


def _check_shards(model, specs: dict, shapes: dict, world: int, device: torch.device) -> int:
    """Every planned parameter is a DTensor on this rank's core holding 1/world of its planned dim."""
    from torch.distributed.tensor import DTensor

    checked = 0
    for name, param in model.named_parameters():
        if name not in specs:
            continue
        spec = specs[name]
        assert isinstance(param, DTensor), f"{name} is not a DTensor"
        local = param.to_local()
        assert local.device == device, f"{name} on {local.device}, expected {device}"
        expected = list(shapes[name])
        if spec.dim is not None:
            expected[spec.dim] //= world
        assert list(local.shape) == expected, f"{name}: local {tuple(local.shape)} expected {tuple(expected)}"
        checked += 1
    assert checked == len(specs) and checked > 0, (checked, len(specs))
    return checked


def main():
    names, mode, steps = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3])
    dist.init_process_group("neuron")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("neuron", int(os.environ["LOCAL_RANK"]))
    assert torch.neuron.current_device() == device.index
    from diffusers import TensorParallelConfig
    from diffusers.hooks.tensor_parallel import resolve_tp_shard_specs

    failures = 0
    for name in names:
        reference = None
        if rank == 0:
            ref_pipe, kwargs = build_pipeline(name)
            ref_pipe.set_progress_bar_config(disable=True)
            reference = generate(ref_pipe.to(device), kwargs, steps, seed=0)
            del ref_pipe

        pipe, kwargs = build_pipeline(name)
        pipe.set_progress_bar_config(disable=True)
        model = denoiser(pipe)
        if name not in TP_PIPELINES:
            add_unet_tp_plan(model)
        specs = resolve_tp_shard_specs(model, model._tp_plan, world)
        shapes = {n: p.shape for n, p in model.named_parameters()}
        model.enable_parallelism(config=TensorParallelConfig(tp_degree=world))
        pipe.to(device)
        n_sharded = _check_shards(model, specs, shapes, world, device)
        if mode != "eager":
            compile_denoiser(pipe, mode)
        image = generate(pipe, kwargs, steps, seed=0)
        if rank == 0:
            diff = float(np.abs(image.astype(np.float64) - reference).max())
            ok = diff <= ATOL
            failures += not ok
            print(
                f"RESULT {name} tp={world} {mode} sharded={n_sharded} maxdiff={diff:.3g} {'OK' if ok else 'FAIL'}",
                flush=True,
            )
        dist.barrier()
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
