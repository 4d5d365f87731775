"""Accelerate on neuron beyond tests/distributed's DDP check: `accelerate launch` with one and
two processes, bf16 mixed precision, and save_state/load_state restoring weights, optimizer,
scheduler, dataloader position and the neuron RNG stream."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import REPO, run_python, worker_env

WORKER = Path(__file__).parent / "workers" / "accelerate_state_worker.py"


def _launch(nproc, ckpt):
    multi = ["--multi_gpu"] if nproc > 1 else []
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        *multi,
        "--num_processes",
        str(nproc),
        "--num_machines",
        "1",
        "--mixed_precision",
        "bf16",
        "--dynamo_backend",
        "no",
        str(WORKER),
        str(ckpt),
    ]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    return p.stdout


@pytest.mark.slow
def test_accelerate_launch_single_process_bf16_save_load_state(tmp_path):
    out = _launch(1, tmp_path / "ckpt")
    assert "rank 0/1: ACCELERATE STATE OK" in out, out
    names = set(os.listdir(tmp_path / "ckpt"))
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"} <= names, names


@pytest.mark.multiprocess
@pytest.mark.slow
def test_accelerate_launch_two_processes_bf16_save_load_state(tmp_path):
    out = _launch(2, tmp_path / "ckpt")
    assert out.count("ACCELERATE STATE OK") == 2, out
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= set(os.listdir(tmp_path / "ckpt"))


def test_fp16_mixed_precision_is_refused_on_neuron():
    p = run_python(
        "from accelerate import Accelerator\nAccelerator(mixed_precision='fp16')",
        env={"PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"},
    )
    assert p.returncode != 0
    assert "fp16 mixed precision requires a device" in p.stderr and "'neuron'" in p.stderr, p.stderr[-2000:]
