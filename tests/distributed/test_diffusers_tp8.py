"""Diffusers tensor parallelism at TP=8 on 8 logical cores of a trn2.48xlarge (LNC=2): the
Flux-family and QwenImage pipelines, each sharded 8 ways with diffusers'
`enable_parallelism`, render the image of a one-core run (tests/hf/workers/diffusion_tp_worker.py
checks every planned weight's shard and compares rank 0's image with the reference)."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import worker_env

WORKER = Path(__file__).resolve().parents[1] / "hf" / "workers" / "diffusion_tp_worker.py"
PIPELINES = ("flux", "flux2", "qwenimage", "qwenimage21")
STEPS = 2


@pytest.mark.multiprocess
@pytest.mark.slow
def test_diffusers_tp8_flux_and_qwenimage_match_one_core():
    env = worker_env(TORCH_NEURONX_INSTANCE_TYPE="trn2.48xlarge", NEURON_LOGICAL_NC_CONFIG="2")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=8",
        str(WORKER),
        ",".join(PIPELINES),
        "eager",
        str(STEPS),
    ]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, f"rc {p.returncode}:\n{(p.stdout + p.stderr)[-6000:]}"
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT")]
    assert len(lines) == len(PIPELINES), p.stdout
    for name, line in zip(PIPELINES, lines):
        assert line.startswith(f"RESULT {name} tp=8 eager") and line.endswith("OK"), line
