"""A rank whose LOCAL_RANK has no NeuronCore fails at its first device use.

Real hardware refuses a second process on a core; the simulator refuses every
rank that would otherwise silently share ``neuron:0``, naming the variable, the
instance, the visible cores and what to change.
"""

import os
import subprocess
import sys

import pytest

from helpers import run_python, worker_env

USE_DEVICE = "import torch; print(torch.empty(1, device='neuron').device)"


def _fails(env, *needles, error="RuntimeError"):
    r = run_python(USE_DEVICE, env=env)
    assert r.returncode != 0, r.stdout
    assert error in r.stderr, r.stderr[-2000:]
    for n in needles:
        assert n in r.stderr, (n, r.stderr[-2000:])


def test_local_rank_beyond_the_visible_cores():
    _fails(
        {"TORCH_NEURONX_INSTANCE_TYPE": "trn2.3xlarge", "NEURON_LOGICAL_NC_CONFIG": "2", "LOCAL_RANK": "5"},
        "LOCAL_RANK=5 has no NeuronCore",
        "sees 4 NeuronCores",
        "logical cores 0,1,2,3",
        "trn2.3xlarge",
        "--nproc_per_node=4",
        "NEURON_RT_VISIBLE_CORES",
        "TORCH_NEURONX_ALLOW_CORE_SHARING=1",
    )


def test_second_rank_on_one_visible_core():
    _fails({"NEURON_RT_NUM_CORES": "1", "LOCAL_RANK": "1"}, "LOCAL_RANK=1 has no NeuronCore", "sees 1 NeuronCore ")


@pytest.mark.parametrize("value", ["abc", "1.5", "-1", ""])
def test_local_rank_not_an_integer(value):
    _fails({"LOCAL_RANK": value}, f"LOCAL_RANK='{value}' is not a non-negative integer", error="ValueError")


@pytest.mark.slow
def test_valid_local_rank_and_explicit_sharing():
    r = run_python(USE_DEVICE, env={"NEURON_RT_NUM_CORES": "2", "LOCAL_RANK": "1"})
    assert r.returncode == 0 and r.stdout.split() == ["neuron:1"], r.stderr[-2000:]
    r = run_python(
        USE_DEVICE, env={"NEURON_RT_NUM_CORES": "2", "LOCAL_RANK": "3", "TORCH_NEURONX_ALLOW_CORE_SHARING": "1"}
    )
    assert r.returncode == 0 and r.stdout.split() == ["neuron:1"], r.stderr[-2000:]


def test_without_local_rank_the_device_is_neuron0():
    env = dict(os.environ)
    env.pop("LOCAL_RANK", None)
    r = subprocess.run([sys.executable, "-c", USE_DEVICE], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and r.stdout.split() == ["neuron:0"], r.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_torchrun_third_rank_on_two_cores_fails():
    script = (
        "import os, torch\n"
        "x = torch.ones(1, device='neuron')\n"
        "print('RANK', os.environ['LOCAL_RANK'], x.device, flush=True)\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=3",
        "--no-python",
        sys.executable,
        "-c",
        script,
    ]
    p = subprocess.run(cmd, env=worker_env(NEURON_RT_NUM_CORES="2"), capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-4000:]
    assert "LOCAL_RANK=2 has no NeuronCore" in out, out[-4000:]
    assert "RANK 2" not in out, out[-4000:]
