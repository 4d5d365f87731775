"""Diffusers text-to-image pipelines on neuron (issue #6), built from local configs by
examples/diffusion_pipelines.py: eager and compiled against CPU in this process; tensor
parallelism (diffusers' `enable_parallelism`, neuron path) against a one-core run under
torchrun with workers/diffusion_tp_worker.py.

The pipeline builders live next to the example (examples/diffusion_pipelines.py) so the
example is self-contained for users; the tests import that same module rather than a copy.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
WORKERS = Path(__file__).parent / "workers"
sys.path.insert(0, str(EXAMPLES))

from diffusion import compile_denoiser, generate  # noqa: E402
from diffusion_pipelines import PIPELINES, build_pipeline  # noqa: E402

from helpers import worker_env

os.environ.setdefault("HF_HUB_OFFLINE", "1")
STEPS = 2
# Pixels are in [0, 1]. Eager neuron is bit-identical to CPU except where diffusers itself
# narrows float64 to float32 on neuron (Flux/Flux2 RoPE tables): up to ~3e-3.
ATOL = 5e-3

_cpu_images: dict = {}


def _cpu_image(name: str) -> np.ndarray:
    if name not in _cpu_images:
        pipe, kwargs = build_pipeline(name)
        pipe.set_progress_bar_config(disable=True)
        _cpu_images[name] = generate(pipe, kwargs, STEPS, seed=0)
    return _cpu_images[name]


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape
    return float(np.abs(a.astype(np.float64) - b).max())


def test_pipeline_seeded_with_a_neuron_generator():
    """Diffusers samples latents on CPU for neuron with the caller's generator: a neuron
    generator draws them on the host from its (seed, offset), so seeded runs repeat."""
    from diffusers.utils.torch_utils import randn_tensor

    g = torch.Generator("neuron").manual_seed(0)
    latents = randn_tensor((1, 4, 8, 8), generator=g, device=torch.device("neuron"))
    assert latents.device.type == "neuron" and g.get_offset() == 256
    pipe, kwargs = build_pipeline(PIPELINES[0])
    pipe.set_progress_bar_config(disable=True)
    pipe.to("neuron")
    images = []
    for _ in range(2):
        generator = torch.Generator("neuron").manual_seed(0)
        images.append(pipe(prompt="a cat", num_inference_steps=STEPS, generator=generator, output_type="np", **kwargs))
    a, b = (out.images[0] for out in images)
    assert np.isfinite(a).all() and np.array_equal(a, b)


@pytest.mark.parametrize("name", PIPELINES)
def test_pipeline_eager_matches_cpu(name):
    pipe, kwargs = build_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    pipe.to("neuron")
    assert pipe.device.type == "neuron" and next(pipe.vae.parameters()).is_neuron
    image = generate(pipe, kwargs, STEPS, seed=0)
    assert np.isfinite(image).all() and image.std() > 0
    assert _max_diff(image, _cpu_image(name)) <= ATOL


@pytest.mark.slow
@pytest.mark.parametrize("name", PIPELINES)
def test_pipeline_compiled_matches_cpu(name):
    # SD: the whole UNet in one graph; transformers: diffusers' regional compilation.
    mode = "full" if name == "sd" else "regional"
    pipe, kwargs = build_pipeline(name)
    pipe.set_progress_bar_config(disable=True)
    pipe.to("neuron")
    torch.neuron.reset_dynamo_metrics()
    compile_denoiser(pipe, mode)
    image = generate(pipe, kwargs, STEPS, seed=0)
    metrics = torch.neuron.get_dynamo_metrics()
    assert metrics["graphs_compiled"] >= 1, dict(metrics)
    assert metrics["graph_breaks"] == 0 and not metrics["fallbacks"], dict(metrics)
    assert _max_diff(image, _cpu_image(name)) <= ATOL


def test_example_saves_png(tmp_path):
    """The example end to end: progress bar, PNG, CPU check, non-zero exit on failure."""
    env = worker_env()
    cmd = [
        sys.executable,
        str(EXAMPLES / "diffusion.py"),
        "--pipeline",
        "qwenimage",
        "--steps",
        "2",
        "--check-cpu",
        "--out",
        str(tmp_path),
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    assert "2/2" in p.stderr  # the pipeline's own tqdm bar
    assert "-> OK" in p.stdout
    from PIL import Image

    with Image.open(tmp_path / "qwenimage_neuron_none.png") as img:
        assert img.size == (32, 32)


def test_example_compare_rejects_mismatch():
    from diffusion import compare

    ref = np.zeros((4, 4, 3), np.float32)
    assert compare("same", ref, ref, 0.0)
    assert not compare("off", ref + 0.1, ref, 0.01)
    assert not compare("shape", ref[:2], ref, 1.0)


def _torchrun(nproc: int, *args, env=None, timeout=1200) -> str:
    full_env = worker_env(**(env or {}))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        str(WORKERS / "diffusion_tp_worker.py"),
        *map(str, args),
    ]
    p = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"rc {p.returncode}:\n{(p.stdout + p.stderr)[-6000:]}"
    return p.stdout


def _results(out: str) -> list[str]:
    lines = [line for line in out.splitlines() if line.startswith("RESULT")]
    assert lines and all(line.endswith("OK") for line in lines), out
    return lines


@pytest.mark.multiprocess
def test_tp2_eager_every_pipeline():
    """TP=2 for the four models with a diffusers `_tp_plan` and the UNet with the guide's plan."""
    lines = _results(_torchrun(2, ",".join(PIPELINES), "eager", STEPS))
    assert len(lines) == len(PIPELINES)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_tp2_compiled():
    """Regional compilation of DTensor-sharded Flux blocks (two block classes)."""
    assert len(_results(_torchrun(2, "flux", "regional", STEPS))) == 1


@pytest.mark.slow
@pytest.mark.multiprocess
def test_tp4_lnc2_one_chip():
    """TP=4 over the four logical cores of one trn2 chip at LNC=2, eager and compiled."""
    env = {"TORCH_NEURONX_INSTANCE_TYPE": "trn2.3xlarge", "NEURON_LOGICAL_NC_CONFIG": "2"}
    lines = _results(_torchrun(4, "flux2", "eager", STEPS, env=env))
    lines += _results(_torchrun(4, "flux2", "regional", STEPS, env=env))
    assert len(lines) == 2
