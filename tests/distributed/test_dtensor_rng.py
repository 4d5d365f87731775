"""Random ops on DTensors and FSDP2's reset_parameters on neuron, under torchrun
(workers/dtensor_rng_worker.py): DTensor's RNG tracker reads the neuron
generator's 16-byte (seed, offset) state as it reads CUDA's."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import worker_env

WORKER = Path(__file__).parent / "workers" / "dtensor_rng_worker.py"


@pytest.mark.multiprocess
@pytest.mark.parametrize("nproc", [2, 4])
def test_dtensor_random_ops_and_fsdp2_init(nproc):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", str(WORKER)]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0 and "DTENSOR RNG OK" in p.stdout, out[-6000:]


@pytest.mark.multiprocess
def test_spawned_ranks_are_bound_by_device_mesh_and_user_generators_agree():
    # PyTorch's DTensor tests spawn their ranks without torchrun and bind a device only for
    # NCCL; DeviceMesh binds the rest, provided joining the group left the device alone.
    from torch.testing._internal.common_utils import find_free_port

    worker = Path(__file__).parent / "workers" / "spawned_mesh_worker.py"
    cmd = [sys.executable, str(worker), "4", str(find_free_port())]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "SPAWNED MESH OK" in p.stdout, (p.stdout + p.stderr)[-6000:]
