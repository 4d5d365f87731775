"""accelerator.load_state with two ranks on neuron: the safetensors device limitation and the two
ways around it that docs/huggingface.md gives (map_location="cpu"; safe_serialization=False)."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import worker_env

WORKER = Path(__file__).parent / "workers" / "load_state_worker.py"


@pytest.mark.multiprocess
def test_load_state_two_ranks(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(WORKER),
        str(tmp_path / "ckpt"),
    ]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert p.stdout.count("LOAD_STATE OK") == 2, p.stdout


def test_safetensors_loads_to_a_core_by_index_not_by_name(tmp_path):
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    path = str(tmp_path / "w.safetensors")
    w = torch.randn(3, 5)
    save_file({"w": w}, path)
    loaded = load_file(path, device=1)["w"]
    assert loaded.device == torch.device("neuron", 1)
    assert torch.equal(loaded.cpu(), w)
    # safetensors' own device list (docs/huggingface.md): if this stops raising, update the docs
    with pytest.raises(SafetensorError, match="device neuron is invalid"):
        load_file(path, device="neuron")
