"""Seconds per denoising step of a Diffusers pipeline: CPU eager, neuron eager, neuron
compiled (`compile_repeated_blocks(backend="neuron")`), CPU Inductor (the same regional
compilation with backend "inductor"), in one run.

    python benchmarks/diffusion.py                       # flux, "bench" size, 6 steps, 5 rounds
    python benchmarks/diffusion.py --pipeline qwenimage --steps 8 --rounds 7

A step is timed from the pipeline's own `callback_on_step_end` (one transformer forward
plus the scheduler update); the first step of each run and a whole warm-up run (which
compiles) are excluded. Each round runs the four configurations back to back, in
alternating order, so drift and load on the machine affect all alike. "s / step" is the
median over every timed step; the ratios are medians over rounds of the same round's
ratio (each round's median step), which a slow stretch of the machine cannot skew.
Targets: neuron compiled <= CPU eager, and <= 1.05x CPU Inductor.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from diffusion_pipelines import PIPELINES, build_pipeline, denoiser  # noqa: E402

CONFIGS = (
    ("cpu eager", "cpu", None),
    ("neuron eager", "neuron", None),
    ("neuron compiled", "neuron", "neuron"),
    ("cpu inductor", "cpu", "inductor"),
)


def _prepare(name: str, size: str, device: str, backend: str | None):
    pipe, kwargs = build_pipeline(name, size, seed=0)
    pipe.set_progress_bar_config(disable=True)
    pipe.to(device)
    if backend is not None:
        model = denoiser(pipe)
        if getattr(model, "_repeated_blocks", None) and name != "sd":
            model.compile_repeated_blocks(backend=backend, dynamic=False, fullgraph=True)
        else:
            model.compile(backend=backend, dynamic=False, fullgraph=True)
    return pipe, kwargs


def _step_times(pipe, kwargs: dict, steps: int) -> list[float]:
    stamps = []

    def on_step_end(pipeline, step, timestep, callback_kwargs):
        stamps.append(time.perf_counter())
        return callback_kwargs

    generator = torch.Generator("cpu").manual_seed(0)
    with torch.inference_mode():
        pipe(
            prompt="a red fox in the snow",
            num_inference_steps=steps,
            generator=generator,
            output_type="latent",
            callback_on_step_end=on_step_end,
            **kwargs,
        )
    return [b - a for a, b in zip(stamps, stamps[1:])]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", default="flux", choices=PIPELINES)
    parser.add_argument("--size", default="bench", choices=("tiny", "bench"))
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    prepared = {}
    for label, device, backend in CONFIGS:
        start = time.perf_counter()
        pipe, kwargs = _prepare(args.pipeline, args.size, device, backend)
        _step_times(pipe, kwargs, 2)  # warm-up: compiles, first-touch allocations
        prepared[label] = (pipe, kwargs)
        print(f"prepared {label:16s} in {time.perf_counter() - start:6.1f} s", flush=True)

    samples = {label: [] for label, _, _ in CONFIGS}
    per_round = []  # {label: median step of that round}
    for r in range(args.rounds):
        this_round = {}
        for label, _, _ in CONFIGS if r % 2 == 0 else CONFIGS[::-1]:
            pipe, kwargs = prepared[label]
            times = _step_times(pipe, kwargs, args.steps)
            samples[label] += times
            this_round[label] = statistics.median(times)
        per_round.append(this_round)
        print(f"round {r + 1}/{args.rounds} done", flush=True)

    med = {label: statistics.median(v) for label, v in samples.items()}

    def ratio(a: str, b: str) -> float:
        return statistics.median(rnd[a] / rnd[b] for rnd in per_round)

    model = denoiser(prepared["cpu eager"][0])
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"\n{args.pipeline} ({args.size}: {type(model).__name__}, {params:.1f} M params), "
        f"{args.steps} steps x {args.rounds} rounds, torch threads {torch.get_num_threads()}\n"
    )
    print("| configuration | s / step | vs cpu eager | vs cpu inductor |")
    print("|---|---|---|---|")
    for label, _, _ in CONFIGS:
        print(
            f"| {label} | {med[label]:.4f} | {ratio(label, 'cpu eager'):.3f}x | "
            f"{ratio(label, 'cpu inductor'):.3f}x |"
        )
    vs_eager, vs_inductor = ratio("neuron compiled", "cpu eager"), ratio("neuron compiled", "cpu inductor")
    print(
        f"\ntarget neuron compiled <= cpu eager: {'met' if vs_eager <= 1.0 else 'NOT met'} ({vs_eager:.3f}x); "
        f"<= 1.05x cpu inductor: {'met' if vs_inductor <= 1.05 else 'NOT met'} ({vs_inductor:.3f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
