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
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(WORKER),
           str(tmp_path / "ckpt")]
    p = subprocess.run(cmd, env=worker_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    assert p.stdout.count("LOAD_STATE OK") == 2, p.stdout
